"""AI Gateway's log rows (runtime.ai.gateway_store) written in batches: the caps (a gateway's
LOG_ROWS, an account's ACCOUNT_LOG_ROWS) hold after writing past them, the newest rows kept; a row
is readable the moment `log` returns (a read writes the queue first) and is written without a read
too, and at close; a database from before the rows were numbered keeps its rows and their order;
and a row written past the caps costs SQLite a bounded amount of work (its virtual machine's
instructions, counted: not a time), where it was a scan of the whole cap. The rate:
bench/gateway_log_rate.py."""

from __future__ import annotations

import sqlite3
import time

import pytest

from runtime.ai import gateway_store
from runtime.ai.gateway_store import GatewayStore


@pytest.fixture
def store(tmp_path):
    s = GatewayStore(tmp_path / "gw.db")
    yield s
    s.close()


def count(path, where: str = "1") -> int:
    """The rows another connection sees (0 before the store made its table)."""
    with sqlite3.connect(path) as db:
        try:
            return db.execute(f"SELECT COUNT(*) FROM logs WHERE {where}").fetchone()[0]
        except sqlite3.OperationalError:
            return 0


def test_the_caps_hold_after_writing_past_them(store):
    busy = quiet = 0
    for i in range(26_000):  # one busy gateway past its cap, the account past its own
        if i % 2:
            store.log("acct", "busy", {"id": f"b{busy}"})
            busy += 1
        else:
            store.log("acct", f"quiet-{i % 3}", {"id": f"q{quiet}"})
            quiet += 1
    store.log("other", "busy", {"id": "another account's"})
    assert len(store.logs("acct", "busy", limit=50_000)) == gateway_store.LOG_ROWS
    assert count(store.path, "account='acct'") == gateway_store.ACCOUNT_LOG_ROWS  # of 23,000 left
    # the account's oldest went: the quiet gateways' first 3,000 (the busy one's were gone already)
    assert store.get_log("acct", "quiet-0", "q0") is None and store.get_log("acct", "quiet-0", "q3000")
    newest = store.logs("acct", "busy", limit=3)
    assert [r["id"] for r in newest] == [f"b{busy - 1}", f"b{busy - 2}", f"b{busy - 3}"]
    assert store.get_log("acct", "busy", f"b{busy - gateway_store.LOG_ROWS}") is not None
    assert store.get_log("acct", "busy", f"b{busy - gateway_store.LOG_ROWS - 1}") is None
    assert [r["id"] for r in store.logs("other", "busy")] == ["another account's"]


def test_small_caps_hold_across_batches_and_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(gateway_store, "LOG_ROWS", 7)
    monkeypatch.setattr(gateway_store, "ACCOUNT_LOG_ROWS", 12)
    monkeypatch.setattr(gateway_store, "FLUSH_ROWS", 5)
    store = GatewayStore(tmp_path / "gw.db")
    try:
        for i in range(40):
            store.log("a", f"g{i % 2}", {"id": f"r{i}"})
            if i % 9 == 0:  # reads in between write partial batches
                assert store.get_log("a", f"g{i % 2}", f"r{i}") == {"id": f"r{i}"}
        g0 = [r["id"] for r in store.logs("a", "g0")]
        g1 = [r["id"] for r in store.logs("a", "g1")]
        assert g0 == [f"r{i}" for i in range(38, 27, -2)]  # the account's 12 newest: 6 in each
        assert g1 == [f"r{i}" for i in range(39, 28, -2)]
        for i in range(40, 50):  # then one gateway alone: its cap, 7, binds before the account's
            store.log("a", "g1", {"id": f"r{i}"})
        assert [r["id"] for r in store.logs("a", "g1")] == [f"r{i}" for i in range(49, 42, -1)]
        assert count(store.path, "account='a'") == 12
    finally:
        store.close()


def test_a_row_is_readable_as_soon_as_it_is_logged(store):
    store.log("acct", "gw", {"id": "one", "score": None})
    assert store.get_log("acct", "gw", "one") == {"id": "one", "score": None}
    store.log("acct", "gw", {"id": "two"})
    assert store.patch_log("acct", "gw", "two", {"score": 90})
    store.log("acct", "gw", {"id": "three"})
    assert [r["id"] for r in store.logs("acct", "gw")] == ["three", "two", "one"]
    assert store.get_log("acct", "gw", "two") == {"id": "two", "score": 90}
    assert store.get_log("other", "gw", "one") is None  # still no account reads another's


def test_a_queued_row_is_written_without_a_read_and_at_close(store, tmp_path):
    store.log("acct", "gw", {"id": "soon"})
    deadline = time.monotonic() + 30
    while count(store.path) == 0 and time.monotonic() < deadline:  # another connection sees it
        time.sleep(0.01)
    assert count(store.path) == 1
    later = GatewayStore(tmp_path / "later.db")
    for i in range(10):
        later.log("acct", "gw", {"id": f"r{i}"})
    later.close()
    assert count(later.path) == 10


def test_an_old_database_keeps_its_rows_and_their_order(tmp_path, monkeypatch):
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:  # the schema and rows of a store before the rows were numbered
        db.executescript(
            "CREATE TABLE logs (id TEXT PRIMARY KEY, account TEXT NOT NULL, gateway TEXT NOT NULL, "
            "created REAL NOT NULL, row TEXT NOT NULL);"
            "CREATE INDEX logs_by_gateway ON logs (account, gateway, created);"
            "CREATE INDEX logs_by_account ON logs (account, created);"
        )
        rows = [(f"o{i}", "acct", f"g{i % 2}", 100.0 + i, f'{{"id": "o{i}"}}') for i in range(6)]
        db.executemany("INSERT INTO logs VALUES (?,?,?,?,?)", rows)
    monkeypatch.setattr(gateway_store, "LOG_ROWS", 4)
    store = GatewayStore(path)
    try:
        assert [r["id"] for r in store.logs("acct", "g0")] == ["o4", "o2", "o0"]
        store.log("acct", "g0", {"id": "n0"})
        store.log("acct", "g0", {"id": "n1"})
        assert [r["id"] for r in store.logs("acct", "g0")] == ["n1", "n0", "o4", "o2"]
        assert [r["id"] for r in store.logs("acct", "g1")] == ["o5", "o3", "o1"]
    finally:
        store.close()


def test_a_row_past_the_caps_costs_a_bounded_amount_of_work(store, monkeypatch):
    monkeypatch.setattr(gateway_store, "LOG_ROWS", 1_000)
    monkeypatch.setattr(gateway_store, "ACCOUNT_LOG_ROWS", 2_000)
    for i in range(2_500):  # both caps reached
        store.log("acct", f"g{i % 2}", {"id": f"r{i}"})
    store.logs("acct", "g0", 1)
    instructions = [0]

    def counted() -> int:
        instructions[0] += 100
        return 0

    store._conn().set_progress_handler(counted, 100)
    for i in range(500):
        store.log("acct", f"g{i % 2}", {"id": f"s{i}"})
    store.logs("acct", "g0", 1)
    # an index range a batch, ~60 instructions a row; a scan of the caps' rows was ~40,000 a row
    assert instructions[0] / 500 < 1_000
