"""AI Gateway's log rows a second (runtime.ai.gateway_store), written past the caps: the store as it
was (31d9def's statements: a row, then two `DELETE ... NOT IN (SELECT ... LIMIT n)` per insert, each
its own commit) on its first rows, as the baseline; the batched store on enough rows that both caps
bind (a gateway's LOG_ROWS, an account's ACCOUNT_LOG_ROWS), then with a read after every row (each
read writes the queue first: a batch of one); the rows each keeps, which the caps bound.

    python bench/gateway_log_rate.py [--rows 30000] [--baseline-rows 3000] [--read-after-rows 5000]

Rows go to the state dir's disk as `edge dev`'s do (a temporary folder beside the repository's
.edge/), one in two to one busy gateway and the rest to three others of the same account.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sqlite3
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runtime.ai import gateway_store  # noqa: E402
from runtime.ai.gateway_store import GatewayStore  # noqa: E402


class BeforeStore:
    """31d9def's log(): the row, then the gateway's and the account's caps by NOT IN scans, each
    statement committed on its own."""

    def __init__(self, path: Path):
        self.db = sqlite3.connect(path, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.executescript(
            "CREATE TABLE logs (id TEXT PRIMARY KEY, account TEXT NOT NULL, gateway TEXT NOT NULL, "
            "created REAL NOT NULL, row TEXT NOT NULL);"
            "CREATE INDEX logs_by_gateway ON logs (account, gateway, created);"
            "CREATE INDEX logs_by_account ON logs (account, created);"
        )

    def log(self, account: str, gateway: str, entry: dict) -> None:
        db = self.db
        db.execute(
            "INSERT INTO logs (id, account, gateway, created, row) VALUES (?,?,?,?,?)",
            (entry["id"], account, gateway, time.time(), json.dumps(entry)),
        )
        db.execute(
            "DELETE FROM logs WHERE account=? AND gateway=? AND id NOT IN (SELECT id FROM logs "
            "WHERE account=? AND gateway=? ORDER BY created DESC, rowid DESC LIMIT ?)",
            (account, gateway, account, gateway, gateway_store.LOG_ROWS),
        )
        db.execute(
            "DELETE FROM logs WHERE account=? AND id NOT IN (SELECT id FROM logs "
            "WHERE account=? ORDER BY created DESC, rowid DESC LIMIT ?)",
            (account, account, gateway_store.ACCOUNT_LOG_ROWS),
        )

    def close(self) -> None:
        self.db.close()


ENTRY = {  # a log row's fields as runtime.ai.gateway logs them
    "created_at": 0.0, "gateway": "busy", "provider": "workers-ai", "path": "workers-ai/@cf/meta/llama",
    "model": "@cf/meta/llama", "step": 0, "success": True, "cached": False, "status_code": 200,
    "error": None, "duration": 12.5, "attempts": 1, "stream": False, "tokens_in": 12, "tokens_out": 40,
    "tags": ["checkout"], "metadata": {"user": "ada"}, "event_id": None, "request_id": "r", "score": None,
    "feedback": None,
}  # fmt: skip


def gateway_of(i: int) -> str:
    return "busy" if i % 2 else f"quiet-{i // 2 % 3}"


def write(store, rows: int, read_after: bool = False) -> tuple[float, list[float]]:
    """(rows a second over all, rows a second in each fifth)."""
    marks, started = [], time.perf_counter()
    fifth = max(1, rows // 5)
    last = started
    for i in range(rows):
        log_id = uuid.uuid4().hex
        store.log("acct", gateway_of(i), {**ENTRY, "id": log_id})
        if read_after:
            store.get_log("acct", gateway_of(i), log_id)
        if (i + 1) % fifth == 0:
            now = time.perf_counter()
            marks.append(fifth / (now - last))
            last = now
    if hasattr(store, "logs"):
        store.logs("acct", "busy", 1)  # what is queued, written
    return rows / (time.perf_counter() - started), marks


def kept(path: Path) -> tuple[int, int]:
    with sqlite3.connect(path) as db:
        busy = db.execute("SELECT COUNT(*) FROM logs WHERE account='acct' AND gateway='busy'").fetchone()[0]
        return busy, db.execute("SELECT COUNT(*) FROM logs WHERE account='acct'").fetchone()[0]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=30_000)
    parser.add_argument("--baseline-rows", type=int, default=3_000)
    parser.add_argument("--read-after-rows", type=int, default=5_000)
    args = parser.parse_args()
    (REPO / ".edge").mkdir(exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="gateway-log-rate-", dir=REPO / ".edge"))
    caps = f"caps: {gateway_store.LOG_ROWS} a gateway, {gateway_store.ACCOUNT_LOG_ROWS} an account"
    print(f"AI Gateway log rows, {caps}; batches of {gateway_store.FLUSH_ROWS}, or {gateway_store.FLUSH_S} s")
    print(f"{'store':34} {'rows':>7} {'rows/s':>8}  {'rows/s by fifth':34} {'kept: busy':>10} {'account':>8}")
    try:
        results = {}
        runs = [
            ("before (31d9def)", BeforeStore, args.baseline_rows, False),
            ("batched", GatewayStore, args.rows, False),
            ("batched, getLog after each row", GatewayStore, args.read_after_rows, False),
        ]
        for name, kind, rows, _ in runs:
            if rows <= 0:
                continue
            path = folder / f"{len(results)}.db"
            store = kind(path)
            rate, marks = write(store, rows, read_after=name.endswith("each row"))
            store.close()
            busy, account = kept(path)
            results[name] = rate
            by_fifth = " ".join(f"{m:6.0f}" for m in marks)
            print(f"{name:34} {rows:7d} {rate:8.0f}  {by_fifth:34} {busy:10d} {account:8d}", flush=True)
        if "before (31d9def)" in results and "batched" in results:
            print(f"batched / before: {results['batched'] / results['before (31d9def)']:.1f}x")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
