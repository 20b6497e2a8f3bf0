"""KV, D1 and R2 stores as the runtime runs them: shapes, limits, hostile SQL, keys, accounts."""

from __future__ import annotations

import asyncio
import stat

import pytest

from runtime.bindings import BindingError, BindingRef, BindingStores, binding_refs
from runtime.bindings.d1 import split_statements
from workers.bindings import D1Database, KVNamespace, R2Bucket, binding_error


class Clock:
    def __init__(self, now: float = 1_800_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def stores(tmp_path):
    s = BindingStores(tmp_path / ".edge", d1_query_s=0.5)
    yield s
    s.close()


def sdk(stores: BindingStores, cls, kind: str, ident: str, account: str = "acct"):
    """The worker's SDK object wired straight to the stores (the IPC hop left out)."""

    async def transport(method, args, kwargs):
        try:
            return await stores.call(account, BindingRef(kind, ident), method, args, kwargs)
        except BindingError as exc:
            raise binding_error(exc.type, str(exc)) from None

    return cls(transport)


def run(coro):
    return asyncio.run(coro)


# --- KV ----------------------------------------------------------------------------------------------


def test_kv_round_trip_types_metadata_and_ttl(stores):
    clock = Clock()
    stores.store("kv").clock = clock
    kv = sdk(stores, KVNamespace, "kv", "ns1")

    async def go():
        assert await kv.get("missing") is None
        await kv.put("greeting", "héllo")
        assert await kv.get("greeting") == "héllo"
        assert await kv.get("greeting", type="arrayBuffer") == "héllo".encode()
        await kv.put("cfg", '{"a": [1, 2]}', metadata={"v": 3})
        assert await kv.get("cfg", "json") == {"a": [1, 2]}
        assert await kv.get("cfg", {"type": "json", "cacheTtl": 60}) == {"a": [1, 2]}
        chunks = [c async for c in await kv.get("cfg", type="stream")]
        assert b"".join(chunks) == b'{"a": [1, 2]}'
        with_meta = await kv.getWithMetadata("cfg", type="json")
        assert with_meta.value == {"a": [1, 2]} and with_meta["metadata"] == {"v": 3}
        assert (await kv.getWithMetadata("nope")).value is None
        await kv.put("short", b"\x00\x01", {"expirationTtl": 60})
        assert await kv.get("short", "arrayBuffer") == b"\x00\x01"
        listed = await kv.list()
        assert [k["name"] for k in listed.keys] == ["cfg", "greeting", "short"]
        assert listed["keys"][0]["metadata"] == {"v": 3}
        assert listed["keys"][2]["expiration"] == int(clock.now) + 60
        clock.now += 61  # past its TTL: invisible to get and list
        assert await kv.get("short") is None
        assert [k.name for k in (await kv.list()).keys] == ["cfg", "greeting"]
        await kv.delete("greeting")
        assert await kv.get("greeting") is None

    run(go())


def test_kv_list_prefix_limit_and_cursor(stores):
    kv = sdk(stores, KVNamespace, "kv", "ns")

    async def go():
        for i in range(7):
            await kv.put(f"user:{i}", str(i))
        await kv.put("other", "x")
        seen, cursor = [], None
        while True:
            page = await kv.list(prefix="user:", limit=3, cursor=cursor)
            seen += [k["name"] for k in page["keys"]]
            if page.list_complete:
                assert page.cursor is None
                break
            cursor = page.cursor
        assert seen == [f"user:{i}" for i in range(7)]
        with pytest.raises(TypeError, match="invalid cursor"):
            await kv.list(cursor="%%%")

    run(go())


def test_kv_limits_are_cloudflares(stores):
    kv = sdk(stores, KVNamespace, "kv", "ns")

    async def go():
        with pytest.raises(ValueError, match="512"):
            await kv.put("k" * 513, "v")
        with pytest.raises(TypeError, match="must not be"):
            await kv.put("..", "v")
        with pytest.raises(ValueError, match="1024"):
            await kv.put("k", "v", metadata={"x": "y" * 1100})
        with pytest.raises(ValueError, match="expirationTtl"):
            await kv.put("k", "v", expirationTtl=10)
        with pytest.raises(BindingError, match="MiB frame"):
            await stores.call("acct", BindingRef("kv", "ns"), "put", ["k", b"x" * (3 * 2**20)], {})
        with pytest.raises(BindingError, match="unknown option"):
            await stores.call("acct", BindingRef("kv", "ns"), "put", ["k", b"v"], {"evil": 1})
        with pytest.raises(BindingError, match="must be bytes"):
            await stores.call("acct", BindingRef("kv", "ns"), "put", ["k", {"not": "bytes"}], {})

    run(go())


def test_state_files_are_private(stores, tmp_path):
    kv = sdk(stores, KVNamespace, "kv", "ns")
    db = sdk(stores, D1Database, "d1", "db1")
    bucket = sdk(stores, R2Bucket, "r2", "b")

    async def go():
        await kv.put("k", "v")
        await db.exec("CREATE TABLE t (x)")
        await bucket.put("k", "v")

    run(go())
    for path in (tmp_path / ".edge").rglob("*"):
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode == (0o700 if path.is_dir() else 0o600), (path, oct(mode))


# --- D1 ----------------------------------------------------------------------------------------------


def test_d1_prepare_bind_all_first_run_raw(stores):
    db = sdk(stores, D1Database, "d1", "main")

    async def go():
        done = await db.exec("CREATE TABLE users (id INTEGER PRIMARY KEY, name TEXT, avatar BLOB);\n"
                             "CREATE INDEX users_name ON users(name);")  # fmt: skip
        assert done.count == 2 and done["duration"] >= 0
        ins = await db.prepare("INSERT INTO users (name, avatar) VALUES (?, ?)").bind("ada", b"\x89PNG").run()
        assert ins.success and ins.meta.changes == 1 and ins.meta["last_row_id"] == 1
        assert ins.meta.rows_written == 1 and ins.meta.changed_db and ins.meta.size_after > 0
        await db.prepare("INSERT INTO users (name) VALUES (?1)").bind("bob").run()
        result = await db.prepare("SELECT * FROM users ORDER BY id").all()
        assert result.results == [
            {"id": 1, "name": "ada", "avatar": b"\x89PNG"},
            {"id": 2, "name": "bob", "avatar": None},
        ]
        assert result.results[1].name == "bob" and result.meta.rows_read == 2
        stmt = db.prepare("SELECT name FROM users WHERE id = ?")
        assert await stmt.bind(2).first("name") == "bob"
        assert (await stmt.bind(1).first())["name"] == "ada"
        assert await stmt.bind(99).first() is None
        assert await db.prepare("SELECT id, name FROM users ORDER BY id").raw() == [[1, "ada"], [2, "bob"]]
        assert await db.prepare("SELECT id FROM users ORDER BY id").raw(columnNames=True) == [
            ["id"],
            [1],
            [2],
        ]
        injected = "x'); DROP TABLE users; --"
        await db.prepare("INSERT INTO users (name) VALUES (?)").bind(injected).run()
        assert await db.prepare("SELECT count(*) AS n FROM users").first("n") == 3
        assert result.to_py()["meta"]["changes"] == 0

    run(go())


def test_d1_batch_is_one_transaction(stores):
    db = sdk(stores, D1Database, "d1", "main")

    async def go():
        await db.exec("CREATE TABLE t (x INTEGER UNIQUE)")
        ins = db.prepare("INSERT INTO t VALUES (?)")
        results = await db.batch([ins.bind(1), ins.bind(2), db.prepare("SELECT x FROM t ORDER BY x")])
        assert [r.meta.changes for r in results] == [1, 1, 0]
        assert results[2].results == [{"x": 1}, {"x": 2}]
        with pytest.raises(Exception, match="UNIQUE constraint failed"):
            await db.batch([ins.bind(3), ins.bind(1)])  # the second fails: the first is rolled back
        assert await db.prepare("SELECT count(*) AS n FROM t").first("n") == 2

    run(go())


def test_d1_errors_come_back_as_messages(stores):
    db = sdk(stores, D1Database, "d1", "main")

    async def go():
        with pytest.raises(Exception, match="D1_ERROR: no such table: nope"):
            await db.prepare("SELECT * FROM nope").all()
        with pytest.raises(Exception, match="D1_ERROR"):
            await db.prepare("SELECT 1; SELECT 2").all()
        with pytest.raises(TypeError, match="D1_TYPE_ERROR"):
            db.prepare("SELECT ?").bind(object())
        with pytest.raises(Exception, match="D1_TYPE_ERROR"):  # a forged call past the SDK's check
            await stores.call("acct", BindingRef("d1", "main"), "query", ["SELECT ?", [{"a": 1}]], {})
        with pytest.raises(BindingError, match="at most 100"):
            await stores.call("acct", BindingRef("d1", "main"), "query", ["SELECT 1", [1] * 101], {})
        with pytest.raises(BindingError, match="arguments"):
            await stores.call("acct", BindingRef("d1", "main"), "query", "SELECT 1", {})
        assert await db.prepare("SELECT 1 AS one").first("one") == 1  # still serving

    run(go())


def test_d1_a_runaway_recursive_query_is_stopped(stores):
    db = sdk(stores, D1Database, "d1", "main")
    forever = "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT max(x) FROM c"

    async def go():
        with pytest.raises(Exception, match="ran past 0.5 s"):
            await db.prepare(forever).all()
        assert await db.prepare("SELECT 2 AS two").first("two") == 2

    run(go())


@pytest.mark.parametrize(
    "sql",
    [
        "ATTACH DATABASE '/tmp/other.db' AS other",
        "VACUUM INTO '/tmp/copy.db'",
        "PRAGMA journal_mode = DELETE",
        "PRAGMA writable_schema = ON",
        "SELECT load_extension('/tmp/evil.so')",
        "BEGIN",
        "SAVEPOINT s",
    ],
)
def test_d1_refuses_sql_that_reaches_outside(stores, tmp_path, sql):
    db = sdk(stores, D1Database, "d1", "main")

    async def go():
        with pytest.raises(Exception, match="not authorized"):
            await db.prepare(sql).run()

    run(go())
    assert not (tmp_path / "copy.db").exists()


def test_d1_read_only_pragmas_and_result_cap(stores, monkeypatch):
    from runtime.bindings import d1

    db = sdk(stores, D1Database, "d1", "main")

    async def go():
        await db.exec("CREATE TABLE t (a, b)")
        info = await db.prepare("PRAGMA table_info(t)").all()
        assert [r["name"] for r in info.results] == ["a", "b"]
        monkeypatch.setattr(d1, "RESULT_BYTES", 1000)
        await db.prepare("INSERT INTO t VALUES (?, ?)").bind("x" * 600, "y" * 600).run()
        with pytest.raises(Exception, match="result is over"):
            await db.prepare("SELECT * FROM t").all()

    run(go())


def test_split_statements_keeps_strings_comments_and_triggers_whole():
    sql = """
    -- a comment; with a semicolon
    CREATE TABLE t (x TEXT DEFAULT 'a;b');
    CREATE TRIGGER tr AFTER INSERT ON t BEGIN UPDATE t SET x = 'c;d'; END;
    INSERT INTO t VALUES ('e;f')
    """
    out = split_statements(sql)
    assert len(out) == 3 and out[1].endswith("END;") and out[2].startswith("INSERT")


# --- R2 ----------------------------------------------------------------------------------------------


def test_r2_put_get_head_list_delete(stores):
    bucket = sdk(stores, R2Bucket, "r2", "assets")

    async def go():
        put = await bucket.put(
            "img/cat.json",
            '{"meow": true}',
            httpMetadata={"contentType": "application/json"},
            customMetadata={"owner": "ada"},
        )
        assert put.key == "img/cat.json" and put.size == 14 and put.httpEtag == f'"{put.etag}"'
        obj = await bucket.get("img/cat.json")
        assert await obj.json() == {"meow": True}
        assert obj.httpMetadata.contentType == "application/json" and obj["customMetadata"] == {
            "owner": "ada"
        }
        assert obj.uploaded.year >= 2024 and obj.etag == put.etag
        headers = {}
        obj.writeHttpMetadata(headers)
        assert headers == {"content-type": "application/json"}
        head = await bucket.head("img/cat.json")
        assert head.size == 14 and not hasattr(head, "text")
        assert await bucket.get("missing") is None and await bucket.head("missing") is None
        for key in ("img/dog.png", "img/sub/x", "readme.txt", "zeta"):
            await bucket.put(key, b"data")
        top = await bucket.list(delimiter="/")
        assert [o.key for o in top["objects"]] == ["readme.txt", "zeta"]
        assert top.delimitedPrefixes == ["img/"] and not top.truncated
        under = await bucket.list(prefix="img/", delimiter="/")
        assert [o.key for o in under.objects] == ["img/cat.json", "img/dog.png"]
        assert under.delimitedPrefixes == ["img/sub/"]
        keys, cursor = [], None
        while True:
            page = await bucket.list(limit=2, cursor=cursor)
            keys += [o.key for o in page.objects]
            if not page.truncated:
                break
            cursor = page.cursor
        assert keys == ["img/cat.json", "img/dog.png", "img/sub/x", "readme.txt", "zeta"]
        await bucket.delete("zeta")
        await bucket.delete(["img/dog.png", "img/sub/x", "never-there"])
        assert [o.key for o in (await bucket.list()).objects] == ["img/cat.json", "readme.txt"]

    run(go())


def test_r2_keys_are_never_paths(stores, tmp_path):
    bucket = sdk(stores, R2Bucket, "r2", "../../escape")
    state = tmp_path / ".edge"

    async def go():
        for key in ("../../../state.db", "/etc/passwd", "a/../../b", "..", "nul\x00byte"):
            await bucket.put(key, key)
            assert await (await bucket.get(key)).text() == key

    run(go())
    files = [p for p in state.rglob("*") if p.is_file()]
    assert all(p.is_relative_to(state / "r2") for p in files if "objects.sqlite" not in p.name)
    names = {p.name for p in files}
    assert not names & {"state.db", "passwd", "b", ".."}
    assert not (tmp_path / "escape").exists() and not (tmp_path / "state.db").exists()


def test_r2_limits(stores):
    bucket = sdk(stores, R2Bucket, "r2", "b")

    async def go():
        with pytest.raises(ValueError, match="1024"):
            await bucket.put("k" * 1025, "v")
        with pytest.raises(ValueError, match="2048"):
            await bucket.put("k", "v", customMetadata={"a": "b" * 3000})
        with pytest.raises(TypeError, match="unknown field"):
            await bucket.put("k", "v", httpMetadata={"x-evil": "1"})
        with pytest.raises(ValueError, match="1000"):
            await bucket.delete([f"k{i}" for i in range(1001)])

    run(go())


# --- accounts and names ------------------------------------------------------------------------------


def test_one_account_never_reaches_anothers_data(stores):
    async def go():
        mine_kv = sdk(stores, KVNamespace, "kv", "shared-id", account="a1")
        theirs_kv = sdk(stores, KVNamespace, "kv", "shared-id", account="a2")
        await mine_kv.put("k", "mine")
        assert await theirs_kv.get("k") is None and (await theirs_kv.list()).keys == []
        mine_db = sdk(stores, D1Database, "d1", "db", account="a1")
        theirs_db = sdk(stores, D1Database, "d1", "db", account="a2")
        await mine_db.exec("CREATE TABLE secret (x); INSERT INTO secret VALUES ('mine')")
        with pytest.raises(Exception, match="no such table"):
            await theirs_db.prepare("SELECT * FROM secret").all()
        mine_r2 = sdk(stores, R2Bucket, "r2", "bucket", account="a1")
        theirs_r2 = sdk(stores, R2Bucket, "r2", "bucket", account="a2")
        await mine_r2.put("k", "mine")
        assert await theirs_r2.get("k") is None and (await theirs_r2.list()).objects == []
        await theirs_r2.delete("k")
        assert await (await mine_r2.get("k")).text() == "mine"

    run(go())


def test_binding_refs_from_config_lists():
    refs = binding_refs(
        {
            "kv_namespaces": [{"binding": "KV", "id": "abc"}],
            "d1_databases": [{"binding": "DB", "database_name": "app", "database_id": None}],
            "r2_buckets": [{"binding": "BUCKET", "bucket_name": "assets"}],
            "queues.producers": [{"binding": "JOBS", "queue": "jobs"}],
        }
    )
    assert refs == {
        "KV": BindingRef("kv", "abc"),
        "DB": BindingRef("d1", "app"),
        "BUCKET": BindingRef("r2", "assets"),
        "JOBS": BindingRef("queue", "jobs"),
    }
    with pytest.raises(ValueError, match=r"config\.r2_buckets\.0: B needs an id"):
        binding_refs({"r2_buckets": [{"binding": "B", "bucket_name": ""}]}, "config.")


def test_env_names_are_checked_once_for_the_config_and_the_upload_alike():
    from runtime.control.config import check_env_names

    with pytest.raises(ValueError, match=r"kv_namespaces\.0\.binding: 'not-ok' is not a valid Python"):
        check_env_names({}, [("kv_namespaces.0.binding", "not-ok")])
    with pytest.raises(ValueError, match=r"r2_buckets\.0\.binding: 'X' is already bound by kv_namespaces\.0"):
        check_env_names({}, [("kv_namespaces.0.binding", "X"), ("r2_buckets.0.binding", "X")])
    with pytest.raises(ValueError, match=r"config\.ai_binding: 'GREETING' is already bound by config\.vars"):
        check_env_names({"GREETING": "hi", "not-an-identifier": 1}, [("ai_binding", "GREETING")], "config.")


def test_the_deploy_api_takes_wranglers_lists_and_refuses_clashes():
    import json

    from runtime.routes.deploy import parse_upload

    def upload(config):
        return json.dumps({"main": "w.py", "files": {"w.py": "x = 1\n"}, "config": config}).encode()

    good = {
        "vars": {"GREETING": "hi"},
        "kv_namespaces": [{"binding": "KV", "id": "ns"}],
        "d1_databases": [{"binding": "DB", "database_name": "app", "database_id": "db-1"}],
        "r2_buckets": [{"binding": "BUCKET", "bucket_name": "files"}],
    }
    parsed, _ = parse_upload(upload(good))
    assert parsed.config.d1_databases[0].database_id == "db-1"
    with pytest.raises(ValueError, match="GREETING"):
        parse_upload(upload({**good, "r2_buckets": [{"binding": "GREETING", "bucket_name": "b"}]}))
    with pytest.raises(ValueError, match="identifier"):
        parse_upload(upload({**good, "kv_namespaces": [{"binding": "../x", "id": "ns"}]}))
    with pytest.raises(ValueError, match="path"):
        parse_upload(upload({**good, "kv_namespaces": [{"binding": "KV", "id": "ns", "path": "/etc"}]}))


def test_each_store_holds_a_bounded_amount_per_account(tmp_path, monkeypatch):
    import runtime.bindings.common as common

    monkeypatch.setitem(common.ACCOUNT_QUOTA_BYTES, "KV", 3000)
    monkeypatch.setitem(common.ACCOUNT_QUOTA_BYTES, "R2", 3000)
    monkeypatch.setitem(common.ACCOUNT_QUOTA_BYTES, "Queues", 3000)
    stores = BindingStores(tmp_path)
    kv, r2, queues = stores.store("kv"), stores.store("r2"), stores.queues
    kv.put("a", "ns", ["k1", b"x" * 1000], {})
    kv.put("a", "ns", ["k1", b"y" * 1000], {})  # replacing a value does not count twice
    kv.put("a", "ns2", ["k2", b"x" * 1000], {})
    with pytest.raises(BindingError, match="over the 0 MiB one account may keep"):
        kv.put("a", "ns", ["k3", b"x" * 1000], {})
    kv.put("b", "ns", ["k3", b"x" * 1000], {})  # another account has its own
    r2.put("a", "bucket", ["o1", b"x" * 2000], {})
    with pytest.raises(BindingError, match="R2"):
        r2.put("a", "other", ["o2", b"x" * 2000], {})
    r2.put("a", "bucket", ["o1", b"y" * 2500], {})  # a smaller total after the replacement
    queues.send("a", "q", ["m" * 1400], {})
    queues.send("a", "q", ["m" * 1400], {})
    with pytest.raises(BindingError, match="Queues"):
        queues.send("a", "q", ["m" * 1400], {})
    assert r2.head("a", "bucket", ["o1"], {})["size"] == 2500
    stores.close()
