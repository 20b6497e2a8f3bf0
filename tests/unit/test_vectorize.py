"""The Vectorize store: indexes per account surviving a reopen, insert / upsert / query /
getByIds / deleteByIds, namespaces, metadata filters, Cloudflare's limits as clear errors that
change nothing, and the approximate search's recall against exact search."""

import numpy as np
import pytest

from runtime.bindings.common import BindingError
from runtime.bindings.vector_filter import check_filter, matches
from runtime.bindings.vector_search import VectorSearch
from runtime.bindings.vectorize import VectorizeStore


def vec(*values):
    return list(map(float, values))


@pytest.fixture
def store(tmp_path):
    s = VectorizeStore(tmp_path / "v.sqlite")
    s.create("a", "docs", 3, "cosine")
    yield s
    s.close()


def call(store, method, *args, account="a", index="docs", **kwargs):
    return store.call(account, index, method, list(args), kwargs)


def test_vectors_are_found_nearest_first_and_survive_a_reopen(tmp_path, store):
    out = call(
        store,
        "insert",
        [
            {"id": "x", "values": vec(1, 0, 0), "metadata": {"kind": "a", "year": 2001}},
            {"id": "y", "values": vec(0, 1, 0), "metadata": {"kind": "b", "year": 1999}, "namespace": "n1"},
            {"id": "z", "values": vec(1, 1, 0), "metadata": {"kind": "a", "year": 2010}},
        ],
    )
    assert out["count"] == 3 and out["mutationId"]
    found = call(store, "query", vec(1, 0.1, 0), topK=2, returnMetadata="all")
    assert [m["id"] for m in found["matches"]] == ["x", "z"] and found["matches"][0]["metadata"][
        "kind"
    ] == "a"
    assert found["matches"][0]["score"] > found["matches"][1]["score"] > 0
    assert call(store, "insert", [{"id": "x", "values": vec(0, 0, 1)}])["count"] == 0  # insert keeps x
    call(store, "upsert", [{"id": "x", "values": vec(0, 0, 1)}])  # upsert replaces it
    assert call(store, "getByIds", ["x", "missing"]) == [{"id": "x", "values": [0.0, 0.0, 1.0]}]
    assert call(store, "query", vec(0, 0, 1), topK=1)["matches"][0]["id"] == "x"
    assert [m["id"] for m in call(store, "query", vec(1, 0, 0), namespace="n1")["matches"]] == ["y"]
    assert call(store, "deleteByIds", ["y", "nope"])["ids"] == ["y"]
    assert call(store, "describe") | {"processedUpToDatetime": None, "processedUpToMutation": None} == {
        "dimensions": 3, "metric": "cosine", "vectorCount": 2,
        "processedUpToDatetime": None, "processedUpToMutation": None,
    }  # fmt: skip
    store.close()
    reopened = VectorizeStore(tmp_path / "v.sqlite")
    assert [m["id"] for m in call(reopened, "query", vec(1, 1, 0), topK=5)["matches"]] == ["z", "x"]
    # another process (the CLI) deleting and re-creating the index is seen at the next call
    other = VectorizeStore(tmp_path / "v.sqlite")
    other.delete("a", "docs")
    other.create("a", "docs", 3, "cosine")
    assert call(reopened, "query", vec(1, 1, 0))["matches"] == []
    other.close()
    reopened.close()


def test_metadata_filters_take_each_operator():
    f = lambda given: check_filter("q", given)  # noqa: E731
    meta = {"genre": "drama", "year": 2004, "tags": "x", "author": {"name": "Ada"}, "ok": True}
    assert matches(meta, f({"genre": "drama"})) and not matches(meta, f({"genre": "comedy"}))
    assert matches(meta, f({"genre": {"$ne": "comedy"}})) and matches(meta, f({"missing": {"$ne": 1}}))
    assert matches(meta, f({"genre": {"$in": ["drama", "noir"]}})) and not matches(
        meta, f({"genre": {"$nin": ["drama"]}})
    )
    assert matches(meta, f({"year": {"$gte": 2004, "$lt": 2005}})) and not matches(
        meta, f({"year": {"$gt": 2004}})
    )
    assert matches(meta, f({"year": {"$lte": 2004}})) and not matches(meta, f({"genre": {"$lt": 5}}))
    assert (
        matches(meta, f({"author.name": "Ada"}))
        and matches(meta, f({"ok": True}))
        and not matches(meta, f({"ok": 1}))
    )
    assert not matches(None, f({"genre": "drama"}))
    for bad, words in [
        ({"genre": {"$regex": "d"}}, "unknown operator"),
        ({"year": {"$gt": [1]}}, "takes a number or a string"),
        ({"x": {"$in": "a"}}, "list"),
        ({"k": "v" * 3000}, "2048"),
        ([1], "must be an object"),
        ({"x": {"$eq": {"a": {"b": 1}}}}, "more than 3 deep"),
        (nested(5000), "more than 3 deep"),  # refused before json.dumps would recurse past the stack
    ]:
        with pytest.raises(BindingError, match=words):
            f(bad)


def nested(depth, leaf="bottom"):
    """Metadata `depth` objects deep: {"l": {"l": ... {"l": leaf}}}, built without recursion."""
    value = leaf
    for _ in range(depth):
        value = {"l": value}
    return value


def depth_of(value):
    depth = 0
    while isinstance(value, dict):
        value, depth = value["l"], depth + 1
    return depth


def test_metadata_nested_past_the_limit_is_refused_and_at_the_limit_stays_readable(store):
    from runtime.bindings.vectorize import MAX_METADATA_DEPTH
    from workers.binding_values import wrap_result

    assert MAX_METADATA_DEPTH == 32
    call(store, "upsert", [{"id": "flat", "values": vec(1, 0, 0), "metadata": {"kind": "flat"}}])
    # hundreds of levels deep is well under 10 KiB of JSON, and walking it back would break the index
    for depth in (33, 400, 5000):
        for method in ("insert", "upsert"):
            with pytest.raises(
                BindingError, match="nests objects and arrays more than 32 deep; the limit is 32"
            ):
                call(store, method, [{"id": "deep", "values": vec(0, 1, 0), "metadata": nested(depth)}])
    with pytest.raises(BindingError, match="more than 32 deep"):  # arrays count as objects do
        call(store, "insert", [{"id": "deep", "values": vec(0, 1, 0), "metadata": {"a": [nested(31)]}}])
    assert call(store, "describe")["vectorCount"] == 1  # nothing stored
    at_limit = nested(32)
    call(store, "insert", [{"id": "deep", "values": vec(0, 1, 0), "metadata": at_limit}])
    found = call(store, "query", vec(0, 1, 0), topK=20, returnMetadata="all")
    assert {m["id"]: m["metadata"] for m in found["matches"]} == {"deep": at_limit, "flat": {"kind": "flat"}}
    assert call(store, "getByIds", ["deep", "flat"]) == [
        {"id": "deep", "values": [0.0, 1.0, 0.0], "metadata": at_limit},
        {"id": "flat", "values": [1.0, 0.0, 0.0], "metadata": {"kind": "flat"}},
    ]
    filtered = call(store, "query", vec(1, 0, 0), filter={"l.l.l": {"$ne": 1}}, returnMetadata="all")
    assert [m["id"] for m in filtered["matches"]] == ["flat", "deep"]
    wrap_result(found), wrap_result(call(store, "getByIds", ["deep"]))  # as the isolate walks an answer


def test_metadata_an_older_version_stored_too_deep_reads_flattened_for_that_vector_only(tmp_path, store):
    """Metadata stored before the depth limit (5000 levels: more than json.loads can parse) keeps its
    first 32 levels; each object below them reads as its JSON text, and every other vector reads as it
    was stored."""
    import json

    call(store, "upsert", [{"id": "flat", "values": vec(1, 0, 0), "metadata": {"kind": "flat"}}])
    deep_text = '{"l": ' * 5000 + '"bottom"' + "}" * 5000  # as json.dumps wrote it, built without it
    stored = [("deep", deep_text), ("shallow", json.dumps(nested(40))), ("damaged", '{"a": [1, ')]
    for ident, meta in stored:
        store._db.execute(
            "INSERT INTO vectors (account, index_name, id, namespace, vals, metadata)"
            " VALUES (?, ?, ?, ?, ?, ?)",
            ("a", "docs", ident, None, np.array(vec(0, 1, 0), dtype=np.float32).tobytes(), meta),
        )
    store._db.execute("UPDATE indexes SET version = version + 1 WHERE account = 'a' AND name = 'docs'")
    found = call(store, "query", vec(0, 1, 0), topK=20, returnMetadata="all")
    by_id = {m["id"]: m["metadata"] for m in found["matches"]}
    assert by_id.keys() == {"flat", "deep", "shallow", "damaged"} and by_id["damaged"] is None
    assert by_id["flat"] == {"kind": "flat"}
    for ident, depth in [("deep", 5000), ("shallow", 40)]:
        meta = by_id[ident]
        assert depth_of(meta) == 32  # 32 objects, the 33rd read as its JSON text
        rest = meta
        for _ in range(32):
            rest = rest["l"]
        assert rest == '{"l": ' * (depth - 32) + '"bottom"' + "}" * (depth - 32)
    got = call(store, "getByIds", ["deep", "flat"])
    assert [v["id"] for v in got] == ["deep", "flat"] and got[0]["metadata"] == by_id["deep"]
    assert [m["id"] for m in call(store, "query", vec(1, 0, 0), filter={"kind": "flat"})["matches"]] == [
        "flat"
    ]
    call(store, "upsert", [{"id": "deep", "values": vec(0, 1, 0), "metadata": {"kind": "fixed"}}])
    assert call(store, "getByIds", ["deep"])[0]["metadata"] == {"kind": "fixed"}


def test_queries_with_a_filter_take_the_top_k_from_the_matching_vectors(store):
    call(
        store,
        "upsert",
        [{"id": f"v{i}", "values": vec(1, i / 10, 0), "metadata": {"i": i}} for i in range(10)],
    )
    found = call(store, "query", vec(1, 0, 0), topK=3, filter={"i": {"$gte": 5}}, returnMetadata="all")
    assert [m["id"] for m in found["matches"]] == ["v5", "v6", "v7"]
    by_id = call(store, "queryById", "v9", topK=2, returnValues=True)
    assert [m["id"] for m in by_id["matches"]] == ["v9", "v8"] and len(by_id["matches"][0]["values"]) == 3
    assert call(store, "queryById", "absent") == {"count": 0, "matches": []}


def test_hostile_calls_get_clear_errors_and_change_nothing(store):
    call(store, "insert", [{"id": "keep", "values": vec(1, 0, 0)}])
    for method, args, kwargs, words in [
        ("query", [vec(1, 0, 0)], {"topK": 10**6}, "at most 100"),
        ("query", [vec(1, 0, 0)], {"topK": 50, "returnValues": True}, "at most 20 with returnValues"),
        ("query", [vec(1, 0)], {}, "2 dimensions; this index takes 3"),
        ("insert", [[{"id": "w", "values": vec(1, 2)}]], {}, "this index takes 3"),
        ("insert", [[{"id": "i" * 65, "values": vec(1, 0, 0)}]], {}, "the limit is 64"),
        ("insert", [[{"id": "big", "values": vec(1, 0, 0), "metadata": {"t": "x" * 11_000}}]], {}, "10240"),
        ("insert", [[{"id": f"n{i}", "values": vec(1, 0, 0)} for i in range(1001)]], {}, "at most 1000"),
        ("insert", [[{"id": "nan", "values": [float("nan"), 0, 0]}]], {}, "NaN"),
        ("insert", [[{"id": "zero", "values": vec(0, 0, 0)}]], {}, "all zeros"),
        (
            "insert",
            [[{"id": "ok", "values": vec(1, 0, 0)}, {"id": "bad", "values": "x"}]],
            {},
            "list of numbers",
        ),
        ("query", [vec(1, 0, 0)], {"filter": {"k": {"$where": 1}}}, "unknown operator"),
        ("query", [vec(1, 0, 0)], {"secret": 1}, "unknown option"),
        ("drop", [], {}, "no method"),
    ]:
        with pytest.raises(BindingError, match=words):
            call(store, method, *args, **kwargs)
    assert call(store, "describe")["vectorCount"] == 1  # nothing half-written
    with pytest.raises(BindingError, match="no Vectorize index 'docs' in this account"):
        call(store, "query", vec(1, 0, 0), account="b")  # another account's index of that name
    with pytest.raises(BindingError, match="lowercase"):
        store.create("a", "Bad_Name", 3, "cosine")
    with pytest.raises(BindingError, match="exists already"):
        store.create("a", "docs", 3, "cosine")
    with pytest.raises(BindingError, match="between 1 and 1536"):
        store.create("a", "wide", 4096, "cosine")


@pytest.mark.parametrize("metric", ["cosine", "euclidean", "dot-product"])
def test_approximate_search_finds_most_of_the_exact_top_10(metric):
    rng = np.random.default_rng(7)
    centers = rng.standard_normal((40, 32))  # clustered, as embeddings are
    data = (centers[rng.integers(0, 40, 3000)] + 0.3 * rng.standard_normal((3000, 32))).astype(np.float32)
    search = VectorSearch(32, metric, exact_below=1000)
    search.add(list(range(3000)), data)
    assert search.approximate
    search.remove([5, 6, 7])
    recall = []
    for q in data[rng.integers(0, 3000, 40)] + 0.1 * rng.standard_normal((40, 32)).astype(np.float32):
        exact = search.exact(q, 10)
        assert all(k not in (5, 6, 7) for k, _ in exact)
        found = search.search(q, 10)
        recall.append(len({k for k, _ in found} & {k for k, _ in exact}) / 10)
    assert np.mean(recall) >= 0.9, np.mean(recall)


def test_accounts_hold_their_own_indexes_and_answers_stay_within_a_frame(store, monkeypatch):
    from runtime.bindings import vectorize

    store.create("b", "docs", 2, "euclidean")  # the same name in another account: another index
    call(store, "upsert", [{"id": "mine", "values": vec(1, 0, 0), "metadata": {"secret": 1}}])
    call(store, "upsert", [{"id": "theirs", "values": vec(3, 4)}], account="b")
    with pytest.raises(BindingError, match="this index takes 2"):
        call(store, "query", vec(1, 0, 0), account="b")
    assert call(store, "getByIds", ["mine"], account="b") == []
    assert call(store, "query", vec(0, 0), account="b", returnMetadata="all")["matches"] == [
        {"id": "theirs", "score": 5.0, "metadata": None}
    ]
    assert [v["id"] for v in call(store, "getByIds", ["mine"])] == ["mine"]
    call(store, "upsert", [{"id": f"m{i}", "values": vec(1, i, 0)} for i in range(10)])
    monkeypatch.setattr(vectorize, "MAX_NAMESPACES", 2)
    call(store, "upsert", [{"id": "n1", "values": vec(1, 0, 0), "namespace": "one"}])
    call(store, "upsert", [{"id": "n2", "values": vec(1, 0, 0), "namespace": "two"}])
    with pytest.raises(BindingError, match="at most 2: reuse namespaces"):
        call(store, "upsert", [{"id": "n3", "values": vec(1, 0, 0), "namespace": "three"}])
    call(store, "upsert", [{"id": "n4", "values": vec(1, 0, 0), "namespace": "one"}])  # a held one is fine
    monkeypatch.setattr(vectorize, "REPLY_BYTES", 9 * 3 * 4 + 600)
    with pytest.raises(BindingError, match="ask for at most"):
        call(store, "getByIds", [f"m{i}" for i in range(10)])


def test_the_cli_creates_lists_shows_and_deletes_indexes(tmp_path, capsys):
    from runtime.cli import main

    config = tmp_path / "wrangler.jsonc"
    config.write_text('{"name": "w", "main": "worker.py", "compatibility_date": "2026-11-01"}')
    (tmp_path / "worker.py").write_text("")
    run = lambda *a: main(["vectorize", *a, "--config", str(config)])  # noqa: E731
    assert run("create", "docs", "--dimensions", "32", "--metric", "dot-product") == 0
    assert run("create", "small", "--preset", "@cf/baai/bge-small-en-v1.5") == 0
    assert run("create", "nometric", "--dimensions", "8") == 2
    assert run("create", "docs", "--dimensions", "8", "--metric", "cosine") == 2
    assert "exists already" in capsys.readouterr().err
    assert run("list") == 0
    listed = capsys.readouterr().out
    assert (
        "docs: 32 dimensions, dot-product, 0 vectors" in listed and "small: 384 dimensions, cosine" in listed
    )
    assert run("delete", "docs") == 0 and run("info", "docs") == 2
    assert "no Vectorize index 'docs'" in capsys.readouterr().err


def test_a_long_call_in_one_accounts_index_never_holds_another_accounts(store):
    """Each index has its own lock (the file's connection is held only around its SQL): while a
    search in one account's index runs, another account's index answers."""
    import threading

    store.create("b", "docs", 4, "cosine")
    call(store, "upsert", [{"id": "x", "values": vec(1, 0, 0)}], account="a")
    call(store, "upsert", [{"id": "y", "values": vec(0, 1, 0, 0)}], account="b")
    search = store._index("a", "docs").search
    running, release = threading.Event(), threading.Event()
    plain = search.search

    def slow(*args, **kwargs):  # a query over a large index, held until the test lets it go
        running.set()
        assert release.wait(10)
        return plain(*args, **kwargs)

    search.search = slow
    first = threading.Thread(target=call, args=(store, "query", vec(1, 0, 0)), daemon=True)
    first.start()
    assert running.wait(10)
    answers = []
    other = threading.Thread(
        target=lambda: answers.append(call(store, "query", vec(0, 1, 0, 0), account="b")), daemon=True
    )
    other.start()
    other.join(10)
    release.set()
    first.join(10)
    assert answers and answers[0]["matches"][0]["id"] == "y"  # answered while a's search ran
