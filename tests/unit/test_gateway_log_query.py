"""AI Gateway's log list in SQL (runtime.ai.gateway_log_query over runtime.ai.gateway_store): each
parameter and filter selects its rows as a WHERE term, pages cover the rows once each in a total
order, meta_info's bounds, the SDK's grouped `filters` read back, every bad value refused naming its
parameter, the default list walking an index (no sort), rows from before the columns filtered too;
a row's bodies (a head past LOG_BODY_BYTES, an account's oldest dropped past its bytes) and a
gateway's own row cap, or none taken when it stops when full."""

from __future__ import annotations

import sqlite3

import pytest

from runtime.ai import gateway_store
from runtime.ai.gateway_log_query import LogQuery, QueryError, list_page
from runtime.ai.gateway_store import GatewayStore

T0 = 1_800_000_000.0


def entry(i: int, **kw) -> dict:
    row = {
        "id": f"r{i:02d}",
        "created_at": T0 + i,
        "provider": "workers-ai",
        "model": "@cf/meta/llama" if i % 2 else "@cf/qwen/qwen",
        "model_type": "Text Generation",
        "success": i % 5 != 0,
        "cached": i % 3 == 0,
        "status_code": 200,
        "duration": 10 * i,
        "tokens_in": i,
        "tokens_out": 2 * i,
        "cost": 0.0,
        "feedback": None,
        "event_id": None,
        "metadata": {"user": f"u{i}"} if i < 4 else {},
        "request_type": "compat" if i == 7 else "workers-ai",
        "request_content_type": "application/json",
        "response_content_type": "text/event-stream" if i == 8 else "application/json",
    }
    return {**row, **kw}


@pytest.fixture
def store(tmp_path):
    s = GatewayStore(tmp_path / "gw.db")
    for i in range(12):
        s.log("acct", "gw", entry(i))
    s.log("other", "gw", entry(99, id="theirs"))
    yield s
    s.close()


def listed(store: GatewayStore, *pairs: tuple[str, str], gateway="gw") -> list[str]:
    """Every page's ids, in order (per_page 5 unless given)."""
    pairs = pairs if any(k == "per_page" for k, _ in pairs) else (*pairs, ("per_page", "5"))
    out, page = [], 1
    while True:
        query = LogQuery.parse([*pairs, ("page", str(page))])
        rows, total, _ = store.read(lambda db, q=query: list_page(db, "acct", gateway, q))
        if not rows:
            return out
        out += [r.split('"id": "')[1].split('"')[0] for r in rows]
        assert total >= len(out)
        page += 1


def flt(key: str, operator: str | None = None, *values: str) -> list[tuple[str, str]]:
    """One filter as the SDK's query writes it."""
    pairs = [("filters.key", key)] + ([("filters.operator", operator)] if operator else [])
    return pairs + [("filters.value", v) for v in values]


def ids(*numbers: int) -> list[str]:
    return [f"r{i:02d}" for i in numbers]


def test_pages_cover_every_row_once_newest_first_and_total_counts_them(store):
    assert listed(store) == ids(*range(11, -1, -1))  # another account's row never among them
    assert listed(store, ("order_by_direction", "asc"), ("per_page", "50")) == ids(*range(12))
    assert listed(store, ("direction", "asc"), ("per_page", "1")) == ids(*range(12))
    _, total, meta = store.read(lambda db: list_page(db, "acct", "gw", LogQuery.parse([("page", "3")])))
    assert total == 12 and meta == {}


def test_an_order_by_column_breaks_ties_by_id_the_same_way(store):
    by_model = listed(store, ("order_by", "model"), ("order_by_direction", "asc"), ("per_page", "4"))
    assert by_model == ids(1, 3, 5, 7, 9, 11, 0, 2, 4, 6, 8, 10)  # llama < qwen, then ids ascending
    by_cached = listed(store, ("order_by", "cached"), ("per_page", "3"))  # desc: cached first, ids desc
    assert by_cached == ids(9, 6, 3, 0, 11, 10, 8, 7, 5, 4, 2, 1)


SELECTS = [
    ([("success", "false")], [10, 5, 0]),
    ([("cached", "true"), ("success", "true")], [9, 6, 3]),
    ([("model", "@cf/meta/llama")], [11, 9, 7, 5, 3, 1]),
    ([("model_type", "Text Embeddings")], []),
    ([("provider", "workers-ai"), ("max_duration", "20")], [2, 1, 0]),
    ([("request_content_type", "application/json"), ("response_content_type", "text/event-stream")], [8]),
    ([("min_tokens_in", "9")], [11, 10, 9]),
    ([("min_tokens_out", "4"), ("max_tokens_out", "6")], [3, 2]),
    ([("min_total_tokens", "30")], [11, 10]),
    ([("max_total_tokens", "0")], [0]),
    ([("min_cost", "0"), ("max_cost", "0"), ("min_duration", "105")], [11]),
    ([("start_date", "2027-01-15T08:00:05+00:00"), ("end_date", "2027-01-15T08:00:07Z")], [7, 6, 5]),
    ([("start_date", "2027-01-15T08:00:10")], [11, 10]),  # no zone: UTC
    ([("search", '"u2"')], [2]),
    ([("search", "u")], [3, 2, 1, 0]),
    ([("search", "%")], []),  # LIKE's own characters match only themselves
    (flt("metadata.value", "eq", "u1", "u3"), [3, 1]),
    (flt("metadata.key", "neq", "user"), list(range(11, 3, -1))),
    (flt("metadata.value", "contains", "u"), [3, 2, 1, 0]),
    (flt("model", "contains", "QWEN"), [10, 8, 6, 4, 2, 0]),
    (flt("id", "neq", "r00", "r11"), list(range(10, 0, -1))),
    (flt("tokens", "gt", "29"), [11, 10]),
    (flt("created_at", "lt", "2027-01-15T08:00:02Z"), [1, 0]),
    (flt("compatibilityMode", "eq", "true"), [7]),
    (flt("feedback", "eq"), list(range(11, -1, -1))),  # the SDK's null
    (flt("event_id", "neq"), []),
    (flt("dlp_action", "eq", "BLOCK"), []),
    ([*flt("authentication", "eq", "true"), ("max_duration", "0")], [0]),
    # the SDK's query, grouped by name: every key, then every operator, then one value each
    (
        [*flt("model"), ("filters.key", "duration"), ("filters.operator", "eq"),
         ("filters.operator", "gt"), ("filters.value", "@cf/qwen/qwen"), ("filters.value", "70")],
        [10, 8],
    ),
    ([("filters", '[{"key": "success", "operator": "eq", "value": [false]}, {"key": "cached", '
                  '"operator": "eq", "value": [true]}]')], [0]),
]  # fmt: skip
assert T0 == 1_800_000_000.0  # 2027-01-15T08:00:00Z, which the dates above count from


@pytest.mark.parametrize(("pairs", "want"), SELECTS, ids=[str(i) for i in range(len(SELECTS))])
def test_each_parameter_and_filter_selects_its_rows(store, pairs, want):
    assert listed(store, *pairs) == ids(*want)


def test_meta_info_gives_the_bounds_of_every_matched_row(store):
    query = LogQuery.parse([("meta_info", "true"), ("success", "true"), ("per_page", "1")])
    rows, total, meta = store.read(lambda db: list_page(db, "acct", "gw", query))
    assert len(rows) == 1 and total == 9
    assert (meta["min_duration"], meta["max_duration"]) == (10, 110)
    assert (meta["min_tokens_in"], meta["max_tokens_out"], meta["max_total_tokens"]) == (1, 22, 33)
    assert meta["min_cost"] == meta["max_cost"] == 0.0 and isinstance(meta["max_duration"], int)


REFUSED = [
    ([("surprise", "1")], "surprise"),
    ([("page", "0")], "page"),
    ([("page", "two")], "page"),
    ([("per_page", "0")], "per_page"),
    ([("per_page", "51")], "per_page"),
    ([("order_by", "bogus")], "order_by"),
    ([("order_by", "cost")], "order_by"),  # the delete's orders, not the list's
    ([("order_by_direction", "up")], "order_by_direction"),
    ([("direction", "up")], "direction"),
    ([("success", "yes")], "success"),
    ([("feedback", "2")], "feedback"),
    ([("min_tokens_in", "many")], "min_tokens_in"),
    ([("max_cost", "nan")], "max_cost"),
    ([("start_date", "monday")], "start_date"),
    ([("meta_info", "1")], "meta_info"),
    ([("search", "x" * 300)], "search"),
    (flt("bogus", "eq"), "filters.0.key"),
    (flt("cost", "contains", "1"), "filters.0.operator"),
    (flt("model", "gt", "a"), "filters.0.operator"),
    (flt("cost", "lt", "1", "2"), "filters.0.value"),
    (flt("cost", "lt", "cheap"), "filters.0.value"),
    (flt("model", "contains"), "filters.0.value"),
    (flt("metadata.key", "eq"), "filters.0.value"),
    (flt("model"), "filters.operator"),
    ([("filters.value", "x")], "filters.key"),
    ([*flt("model"), ("filters.key", "id"), ("filters.operator", "eq"), ("filters.operator", "eq"),
      ("filters.value", "a"), ("filters.value", "b"), ("filters.value", "c")], "filters.value"),
    ([("filters", "not json")], "filters"),
]  # fmt: skip


@pytest.mark.parametrize(("pairs", "param"), REFUSED, ids=[p for _, p in REFUSED])
def test_a_value_that_does_not_read_is_refused_naming_its_parameter(pairs, param):
    with pytest.raises(QueryError) as err:
        LogQuery.parse(pairs)
    assert err.value.param == param and str(err.value).startswith(f"{param}: ")


def test_the_default_list_and_a_date_range_walk_the_index_without_sorting(store):
    for pairs in ([], [("start_date", "2027-01-15T08:00:05Z")], [("order_by_direction", "asc")]):
        query = LogQuery.parse(pairs)
        sql = (
            f"SELECT row FROM logs WHERE account=? AND gateway=? AND {query.where()} {query.order()} LIMIT 5"
        )
        plan = " ".join(
            r[-1]
            for r in store.read(
                lambda db, s=sql, q=query: db.execute(
                    f"EXPLAIN QUERY PLAN {s}", ("a", "g", *q.values)
                ).fetchall()
            )
        )
        assert "logs_by_created" in plan and "TEMP B-TREE" not in plan, plan


def test_rows_from_before_the_columns_are_filtered_too(tmp_path):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the store's schema before the list's columns
        db.executescript(
            "CREATE TABLE logs (id TEXT PRIMARY KEY, account TEXT NOT NULL, gateway TEXT NOT NULL, "
            "created REAL NOT NULL, row TEXT NOT NULL, gateway_seq INTEGER NOT NULL);"
        )
        rows = [
            (
                "o1",
                "acct",
                "gw",
                T0,
                '{"id": "o1", "model": "m1", "success": true, "metadata": {"k": "v"}}',
                1,
            ),
            ("o2", "acct", "gw", T0 + 1, '{"id": "o2", "model": "m2", "success": false, "metadata": {}}', 2),
        ]
        db.executemany("INSERT INTO logs VALUES (?,?,?,?,?,?)", rows)
    store = GatewayStore(path)
    try:
        assert listed(store, ("success", "true")) == ["o1"] and listed(store, ("model", "m2")) == ["o2"]
        assert listed(store, ("search", '"k"')) == ["o1"]
        made = store.read(lambda db: db.execute("SELECT account, id FROM gateways").fetchall())
        assert made == [("acct", "gw")]  # the gateway its logs name is kept as one
    finally:
        store.close()


def test_a_rows_bodies_keep_their_head_and_an_accounts_oldest_go_past_its_bytes(tmp_path, monkeypatch):
    monkeypatch.setattr(gateway_store, "LOG_BODY_BYTES", 100)
    monkeypatch.setattr(gateway_store, "ACCOUNT_LOG_BODY_BYTES", 1_000)
    store = GatewayStore(tmp_path / "gw.db")
    try:
        store.log("acct", "gw", entry(0), b'{"prompt": "short"}', b"x" * 250)
        assert store.log_body("acct", "gw", "r00", "request") == (
            b'{"prompt": "short"}',
            19,
            "application/json",
        )
        assert store.log_body("acct", "gw", "r00", "response") == (b"x" * 100, 250, "application/json")
        detail = store.log_detail("acct", "gw", "r00")
        assert (detail["request_size"], detail["request_head_complete"]) == (19, True)
        assert (detail["response_size"], detail["response_head_complete"]) == (250, False)
        for i in range(1, 12):  # 200 bytes a row: the account keeps its newest five rows' bodies
            store.log("acct", "gw", entry(i), b"q" * 100, b"a" * 100)
        kept = [i for i in range(12) if store.log_body("acct", "gw", f"r{i:02d}", "request")[0] is not None]
        assert kept == [7, 8, 9, 10, 11] and store.get_log("acct", "gw", "r00") is not None  # its row stays
        store.patch_log("acct", "gw", "r11", {"duration": 5}, b"s" * 150)  # a stream's, when it ended
        assert store.log_body("acct", "gw", "r11", "response") == (b"s" * 100, 150, "application/json")
        with pytest.raises(LookupError):
            store.log_body("other", "gw", "r11", "response")
    finally:
        store.close()


def test_a_gateways_own_cap_keeps_its_newest_or_when_it_stops_its_oldest(tmp_path):
    store = GatewayStore(tmp_path / "gw.db")
    try:
        for i in range(6):
            store.log("acct", "newest", entry(i), keep=3)
            store.log("acct", "oldest", entry(i, id=f"o{i}"), keep=3, stop_when_full=True)
        assert [r["id"] for r in store.logs("acct", "newest")] == ids(5, 4, 3)
        assert [r["id"] for r in store.logs("acct", "oldest")] == ["o2", "o1", "o0"]
    finally:
        store.close()
