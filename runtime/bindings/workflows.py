"""The Workflow binding, simulated: instances of each workflow, and their steps, kept per account.

Configured as wrangler writes it (`workflows = [{ name, binding, class_name }]`); `env.BINDING`
is workers.workflows.Workflow. Everything lives in one SQLite file (`.edge/workflows.sqlite`),
keyed by (account, workflow name, instance id), so another account's instance id is not found and
instances outlive a restart of `edge dev`. Besides the worker-facing calls (create, get, status,
pause, resume, terminate, restart, send_event) the store keeps the replay books that
runtime.events.workflows runs instances by (WorkflowBooks: each finished step's result, each
sleep's wake time, each step's attempts). Bounds: params, results and event payloads at most
VALUE_BYTES of JSON; LIVE_INSTANCES unfinished instances per account; STORED_INSTANCES in all
(the oldest finished ones go first); MAX_STEPS steps per instance (Cloudflare's default).
"""

from __future__ import annotations

import json
import re
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import BindingError, open_private_db, options, text
from runtime.bindings.kind import BindingKind
from runtime.bindings.workflow_books import WorkflowBooks, json_value

WORKFLOW_STEP = "workflow.step"  # the binding a workflow's isolate names for its steps
LIVE_INSTANCES = 1000  # queued, running, paused or waiting instances per account, all workflows
STORED_INSTANCES = 10_000  # per account; past it the oldest finished instances are dropped
BATCH = 100  # create_batch, as Cloudflare's limit
PENDING_EVENTS = 100  # events sent to one instance and not yet waited for
ID_CHARS = 100
_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]{0,99}$")
LIVE = ("queued", "running", "paused", "waiting")
FINISHED = ("errored", "terminated", "complete")

SCHEMA = """
CREATE TABLE IF NOT EXISTS instances (
    account TEXT NOT NULL, workflow TEXT NOT NULL, id TEXT NOT NULL,
    status TEXT NOT NULL, params TEXT NOT NULL, created REAL NOT NULL, updated REAL NOT NULL,
    output TEXT, error TEXT, wake_at REAL, waiting_for TEXT, generation INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (account, workflow, id));
CREATE INDEX IF NOT EXISTS instances_due ON instances (account, workflow, status, wake_at);
CREATE TABLE IF NOT EXISTS steps (
    account TEXT NOT NULL, workflow TEXT NOT NULL, id TEXT NOT NULL, name TEXT NOT NULL,
    n INTEGER NOT NULL, kind TEXT NOT NULL, attempts INTEGER NOT NULL DEFAULT 0,
    running INTEGER NOT NULL DEFAULT 0, done INTEGER NOT NULL DEFAULT 0, failed INTEGER NOT NULL DEFAULT 0,
    nonretryable INTEGER NOT NULL DEFAULT 0,
    result TEXT, error TEXT, until REAL, started REAL, finished REAL,
    PRIMARY KEY (account, workflow, id, name, n));
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, account TEXT NOT NULL, workflow TEXT NOT NULL, id TEXT NOT NULL,
    type TEXT NOT NULL, payload TEXT NOT NULL, sent REAL NOT NULL, taken INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS events_of ON events (account, workflow, id, type, taken);
CREATE TABLE IF NOT EXISTS usage (account TEXT PRIMARY KEY, bytes INTEGER NOT NULL);
"""


class WorkflowEntryConfig(msgspec.Struct, kw_only=True):
    """A workflows entry of the wrangler config."""

    name: str
    binding: str
    class_name: str
    script_name: str | None = None


class WorkflowUpload(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    binding: str
    class_name: str
    script_name: str | None = None


def instance_id(value: Any) -> str:
    if not isinstance(value, str) or not _ID.match(value):
        raise BindingError(
            "TypeError",
            f"an instance id is 1 to {ID_CHARS} characters of letters, digits, - and _, got {value!r}"[:300],
        )
    return value


class WorkflowStore:
    """Every account's workflow instances; `books` is what the runtime runs them by."""

    def __init__(self, path: Path, clock: Callable[[], float] = time.time, quota_bytes: int | None = None):
        self._db = open_private_db(path)
        # WAL without a sync per step: a killed edge dev loses nothing (the WAL is in the OS's
        # hands), a power cut at most the last steps, which then run again (at least once, as ever)
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.RLock()
        self.clock = clock
        self.books = WorkflowBooks(self._db, self._lock, clock)
        if quota_bytes is not None:
            self.books.quota_bytes = quota_bytes

    # --- what a worker calls ----------------------------------------------------------------------

    def call(self, account: str, workflow: str, method: str, args: list, kwargs: dict) -> Any:
        if kwargs:
            raise BindingError("TypeError", f"{method}: the SDK passes its options as one dict")
        if method == "create":
            return self.create(account, workflow, [_one_dict(method, args)])[0]
        if method == "create_batch":
            if len(args) != 1 or not isinstance(args[0], list):
                raise BindingError("TypeError", "create_batch: pass a list of {id, params} dicts")
            return self.create(account, workflow, args[0])
        if method in ("get", "status", "pause", "resume", "terminate", "restart", "send_event"):
            if not args:
                raise BindingError("TypeError", f"{method}: an instance id is needed")
            ident = instance_id(args[0])
            if method == "send_event":
                return self.send_event(account, workflow, ident, _one_dict(method, args[1:]))
            if len(args) != 1:
                raise BindingError("TypeError", f"{method}: takes only the instance id")
            if method == "get":
                self._row(account, workflow, ident)
                return {"id": ident}
            if method == "status":
                return self.status(account, workflow, ident)
            return self.control(account, workflow, ident, method)
        raise BindingError("TypeError", f"a Workflow binding has no method {method!r}")

    def create(self, account: str, workflow: str, entries: list) -> list[dict[str, str]]:
        if not 1 <= len(entries) <= BATCH:
            raise BindingError(
                "RangeError", f"create_batch: 1 to {BATCH} instances at once, got {len(entries)}"
            )
        rows = []
        for entry in entries:
            opts = options("create", entry, {"id", "params"}) if isinstance(entry, dict) else None
            if opts is None:
                raise BindingError("TypeError", "create: options are a dict {id, params}")
            ident = instance_id(opts["id"]) if "id" in opts else str(uuid.uuid4())
            params = json_value(
                "create: params", opts.get("params"), "pass a key (a KV or R2 key) instead of the data"
            )
            rows.append((ident, params))
        if len({r[0] for r in rows}) != len(rows):
            raise BindingError("TypeError", "create_batch: two instances have the same id")
        now = self.clock()
        with self._lock:
            live = self._db.execute(
                f"SELECT count(*) FROM instances WHERE account = ? AND status IN {LIVE}", (account,)
            ).fetchone()[0]
            if live + len(rows) > LIVE_INSTANCES:
                raise BindingError(
                    "RangeError",
                    f"create: this account has {live} unfinished workflow instances; at most "
                    f"{LIVE_INSTANCES} may be queued, running, paused or waiting at once: terminate some, "
                    "or wait for them to finish",
                )
            for ident, _ in rows:
                if self._find(account, workflow, ident) is not None:
                    raise BindingError(
                        "Error", f"create: instance {ident!r} of workflow {workflow!r} already exists"
                    )
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self.books.charge(account, sum(len(p) for _, p in rows), "create: params")
                self._db.executemany(
                    "INSERT INTO instances (account, workflow, id, status, params, created, updated)"
                    " VALUES (?, ?, ?, 'queued', ?, ?, ?)",
                    [(account, workflow, ident, params, now, now) for ident, params in rows],
                )
                self._prune(account)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return [{"id": ident} for ident, _ in rows]

    def _prune(self, account: str) -> None:
        """Keep STORED_INSTANCES per account: the oldest finished ones (and their steps) go."""
        count = "SELECT count(*) FROM instances WHERE account = ?"
        stored = self._db.execute(count, (account,)).fetchone()[0]
        if stored <= STORED_INSTANCES:
            return
        old = self._db.execute(
            f"SELECT workflow, id FROM instances WHERE account = ? AND status IN {FINISHED}"
            " ORDER BY updated LIMIT ?",
            (account, stored - STORED_INSTANCES),
        ).fetchall()
        for workflow, ident in old:
            self.books.forget(account, workflow, ident, whole=True)

    def _find(self, account: str, workflow: str, ident: str) -> tuple | None:
        return self._db.execute(
            "SELECT status, output, error, generation, waiting_for FROM instances"
            " WHERE account = ? AND workflow = ? AND id = ?",
            (account, workflow, ident),
        ).fetchone()

    def _row(self, account: str, workflow: str, ident: str) -> tuple:
        with self._lock:
            row = self._find(account, workflow, ident)
        if row is None:
            raise BindingError(
                "Error", f"instance.not_found: workflow {workflow!r} has no instance {ident!r}"
            )
        return row

    def status(self, account: str, workflow: str, ident: str) -> dict[str, Any]:
        status, output, error, _, _ = self._row(account, workflow, ident)
        return {
            "status": status,
            "output": json.loads(output) if output is not None else None,
            "error": json.loads(error) if error is not None else None,
        }

    def control(self, account: str, workflow: str, ident: str, action: str) -> None:
        """pause, resume, terminate or restart, as Cloudflare allows them from each status."""
        allowed = {
            "pause": ("queued", "running", "waiting"),
            "resume": ("paused",),
            "terminate": LIVE,
            "restart": LIVE + FINISHED,
        }[action]
        with self._lock:
            status = self._row(account, workflow, ident)[0]
            if status not in allowed:
                raise BindingError(
                    "Error",
                    f"{action}: instance {ident!r} is {status}; {action} applies to {', '.join(allowed)}",
                )
            key = (account, workflow, ident)
            now = self.clock()
            if action == "restart":
                self.books.forget(account, workflow, ident, whole=False)
                self._db.execute(
                    "UPDATE instances SET status = 'queued', output = NULL, error = NULL, wake_at = NULL,"
                    " waiting_for = NULL, generation = generation + 1, updated = ?"
                    " WHERE account = ? AND workflow = ? AND id = ?",
                    (now, *key),
                )
            else:
                new = {"pause": "paused", "resume": "running", "terminate": "terminated"}[action]
                self._db.execute(
                    "UPDATE instances SET status = ?, updated = ?"
                    " WHERE account = ? AND workflow = ? AND id = ?",
                    (new, now, *key),
                )

    def send_event(self, account: str, workflow: str, ident: str, opts: dict) -> None:
        opts = options("send_event", opts, {"type", "payload"})
        kind = text("send_event: type", opts.get("type"), 100)
        payload = json_value("send_event: payload", opts.get("payload"), "send a key to the data instead")
        now = self.clock()
        with self._lock:
            status, _, _, _, waiting_for = self._row(account, workflow, ident)
            if status in FINISHED:
                raise BindingError("Error", f"send_event: instance {ident!r} is {status}; it takes no events")
            pending = self._db.execute(
                "SELECT count(*) FROM events WHERE account = ? AND workflow = ? AND id = ? AND taken = 0",
                (account, workflow, ident),
            ).fetchone()[0]
            if pending >= PENDING_EVENTS:
                raise BindingError(
                    "RangeError",
                    f"send_event: instance {ident!r} holds {PENDING_EVENTS} events it has not waited for yet",
                )
            self.books.charge(account, len(payload), "send_event: payload")
            self._db.execute(
                "INSERT INTO events (account, workflow, id, type, payload, sent) VALUES (?, ?, ?, ?, ?, ?)",
                (account, workflow, ident, kind, payload, now),
            )
            if status == "waiting" and waiting_for == kind:  # wake it now
                self._db.execute(
                    "UPDATE instances SET wake_at = ? WHERE account = ? AND workflow = ? AND id = ?",
                    (now, account, workflow, ident),
                )

    # --- what the admin API shows -----------------------------------------------------------------

    def describe(self, account: str, workflow: str, ident: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT status, params, created, updated, output, error FROM instances"
                " WHERE account = ? AND workflow = ? AND id = ?",
                (account, workflow, ident),
            ).fetchone()
            if row is None:
                return None
            steps = self._db.execute(
                "SELECT name, n, kind, attempts, done, failed, error, started, finished FROM steps"
                " WHERE account = ? AND workflow = ? AND id = ? ORDER BY rowid",
                (account, workflow, ident),
            ).fetchall()
        status, params, created, updated, output, error = row
        return {
            "id": ident,
            "workflow": workflow,
            "status": status,
            "params": json.loads(params),
            "created": _iso(created),
            "modified": _iso(updated),
            "output": json.loads(output) if output is not None else None,
            "error": json.loads(error) if error is not None else None,
            "steps": [
                {
                    "name": name if n == 1 else f"{name} ({n})",
                    "type": kind,
                    "attempts": attempts,
                    "success": bool(done) if done or failed else None,
                    "error": err,
                    "start": _iso(started),
                    "end": _iso(finished),
                }
                for name, n, kind, attempts, done, failed, err, started, finished in steps
            ],
        }

    def summary(self, account: str) -> dict[str, dict[str, int]]:
        """Per workflow of the account: how many instances are in each status."""
        with self._lock:
            rows = self._db.execute(
                "SELECT workflow, status, count(*) FROM instances WHERE account = ?"
                " GROUP BY workflow, status",
                (account,),
            ).fetchall()
        out: dict[str, dict[str, int]] = {}
        for workflow, status, count in rows:
            out.setdefault(workflow, {})[status] = count
        return out

    def close(self) -> None:
        self._db.close()


def _iso(when: float | None) -> str | None:
    """A time as Cloudflare's API writes it: ISO 8601 in UTC."""
    return datetime.fromtimestamp(when, UTC).isoformat().replace("+00:00", "Z") if when is not None else None


def _one_dict(method: str, args: list) -> dict:
    if len(args) != 1 or not isinstance(args[0], dict):
        raise BindingError("TypeError", f"{method}: pass one options dict")
    return args[0]


KIND = BindingKind(
    "workflow", "workflows", WorkflowEntryConfig, WorkflowUpload, ("name",),
    lambda state_dir, query_s: WorkflowStore(state_dir / "workflows.sqlite"), "workers.workflows:Workflow",
)  # fmt: skip
