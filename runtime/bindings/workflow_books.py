"""The replay books of workflow instances: what runtime.events.workflows runs them by.

A run of an instance is `run(event, step)` from the top; each step it reaches asks here first
(step_call): a finished step answers with its stored result, so its body never runs twice; a
sleep keeps the wake time it was first given; a step's attempts are counted across runs (and
restarts of `edge dev`), against its config's retries. A step that must wait (a sleep not over,
an event not yet sent, a long retry delay) answers "suspend": the instance is `waiting` with a
wake time, and its run ends; `due` hands it back to the runtime once that time comes (or the
event arrives). Every call names the instance's generation: after restart() an old run's calls
only ever hear "suspend".
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Callable
from typing import Any

from runtime.bindings.common import ACCOUNT_QUOTA_BYTES, BindingError
from workers.durations import MAX_MS, duration_ms

# Cloudflare's step defaults: 5 retries, 10 seconds apart, doubling; 10 minutes per attempt
DEFAULT_RETRIES = {"limit": 5, "delay": 10_000, "backoff": "exponential"}
DEFAULT_TIMEOUT_MS = 10 * 60_000
MAX_RETRIES = 10_000
VALUE_BYTES = 1024 * 1024  # params, a step's result, an event's payload, an output (Cloudflare's 1 MiB)
MAX_STEPS = 1024  # steps per instance, as Cloudflare's default
INLINE_WAIT_MS = 1_000  # a retry delay up to this is waited in the run; a longer one suspends it
BACKOFFS = ("constant", "linear", "exponential")


class StepConfig:
    """A step.do config, checked, with Cloudflare's defaults for what it leaves out."""

    def __init__(self, config: Any):
        if not isinstance(config, dict) or set(config) - {"retries", "timeout"}:
            raise BindingError("TypeError", 'step.do config: a dict of "retries" and "timeout"')
        retries = config.get("retries") or {}
        if not isinstance(retries, dict) or set(retries) - {"limit", "delay", "backoff"}:
            raise BindingError(
                "TypeError", 'step.do config: retries is a dict of "limit", "delay", "backoff"'
            )
        retries = {**DEFAULT_RETRIES, **retries}
        limit = retries["limit"]
        if isinstance(limit, bool) or not isinstance(limit, int) or not 0 <= limit <= MAX_RETRIES:
            raise BindingError(
                "RangeError", f"step.do config: retries.limit is 0 to {MAX_RETRIES}, got {limit!r}"
            )
        if retries["backoff"] not in BACKOFFS:
            raise BindingError(
                "TypeError", f"step.do config: retries.backoff is one of {', '.join(BACKOFFS)}"
            )
        try:
            self.delay_ms = duration_ms(retries["delay"], "step.do config: retries.delay")
            self.timeout_ms = duration_ms(
                config.get("timeout", DEFAULT_TIMEOUT_MS), "step.do config: timeout"
            )
        except (TypeError, ValueError) as exc:
            raise BindingError("TypeError", str(exc)) from None
        self.limit, self.backoff = limit, retries["backoff"]
        self.timeout_ms = max(self.timeout_ms, 1)

    def delay_after(self, attempt: int) -> int:
        """The wait before the attempt after `attempt` (1 = the first) failed."""
        factor = {"constant": 1, "linear": attempt, "exponential": 2 ** min(attempt - 1, 40)}[self.backoff]
        return min(self.delay_ms * factor, MAX_MS)


def json_value(what: str, value: Any, fix: str) -> str:
    """`value` as JSON of at most VALUE_BYTES, or BindingError saying so and what to change."""
    try:
        data = json.dumps(value, allow_nan=False, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise BindingError("TypeError", f"{what} must be JSON-serializable ({exc})") from None
    size = len(data.encode("utf-8", "surrogatepass"))
    if size > VALUE_BYTES:
        raise BindingError(
            "RangeError", f"{what} is {size} bytes of JSON; the limit is {VALUE_BYTES // 1024} KiB: {fix}"
        )
    return data


def step_key(args: list) -> tuple[str, int]:
    name, n = (args[0], args[1]) if len(args) >= 2 else (None, None)
    if not isinstance(name, str) or not name or len(name) > 256:
        raise BindingError("TypeError", "a step's name is a non-empty string of at most 256 characters")
    if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= MAX_STEPS:
        raise BindingError("TypeError", "a step's occurrence is a number from 1")
    return name, n


SUSPEND = {"state": "suspend"}


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


class WorkflowBooks:
    def __init__(self, db: sqlite3.Connection, lock: threading.RLock, clock: Callable[[], float],
                 quota_bytes: int = ACCOUNT_QUOTA_BYTES["Workflows"]):  # fmt: skip
        self._db, self._lock, self.clock = db, lock, clock
        self.quota_bytes = quota_bytes  # params, results, events and outputs one account may keep

    # --- what an account keeps (params, results, event payloads, outputs) ---------------------------

    def charge(self, account: str, size: int, what: str) -> None:
        """Count `size` more bytes against the account; BindingError past its quota."""
        row = self._db.execute("SELECT bytes FROM usage WHERE account = ?", (account,)).fetchone()
        used = row[0] if row else 0
        if used + size > self.quota_bytes:
            raise BindingError(
                "RangeError",
                f"{what}: this account's workflows would keep {_size(used + size)}, over the "
                f"{_size(self.quota_bytes)} one account may keep here; store data in KV or R2 and pass "
                "keys, or let finished instances go",
            )
        self._db.execute(
            "INSERT INTO usage (account, bytes) VALUES (?, ?)"
            " ON CONFLICT (account) DO UPDATE SET bytes = bytes + excluded.bytes",
            (account, size),
        )

    def forget(self, account: str, workflow: str, ident: str, whole: bool) -> None:
        """Drop an instance's steps and events (and, if `whole`, the instance), refunding their bytes."""
        key = (account, workflow, ident)
        where = "WHERE account = ? AND workflow = ? AND id = ?"
        size = self._db.execute(
            f"SELECT coalesce(sum(length(result)), 0) FROM steps {where}", key
        ).fetchone()[0]
        size += self._db.execute(
            f"SELECT coalesce(sum(length(payload)), 0) FROM events {where}", key
        ).fetchone()[0]
        size += (
            self._db.execute(
                "SELECT coalesce(length(output), 0) + (CASE WHEN ? THEN length(params) ELSE 0 END)"
                f" FROM instances {where}",
                (whole, *key),
            ).fetchone()[0]
            or 0
        )
        for table in ("steps", "events", *(("instances",) if whole else ())):
            self._db.execute(f"DELETE FROM {table} {where}", key)
        self._db.execute("UPDATE usage SET bytes = max(0, bytes - ?) WHERE account = ?", (size, account))

    # --- the runtime's side -----------------------------------------------------------------------

    def due(
        self, account: str, workflow: str, limit: int, skip: set[str]
    ) -> list[tuple[str, Any, float, int]]:
        """Instances to run now (queued; running, as after a restart of edge dev; waiting whose
        time has come), oldest first, at most `limit`, none of `skip` (running already)."""
        now = self.clock()
        with self._lock:
            rows = self._db.execute(
                "SELECT id, params, created, generation FROM instances WHERE account = ? AND workflow = ?"
                " AND (status IN ('queued', 'running') OR (status = 'waiting' AND wake_at <= ?))"
                " ORDER BY created LIMIT ?",
                (account, workflow, now, limit + len(skip)),
            ).fetchall()
        out = [(i, json.loads(p), c, g) for i, p, c, g in rows if i not in skip]
        return out[:limit]

    def begin(self, account: str, workflow: str, ident: str, generation: int) -> bool:
        """The run of an instance starts: it is `running`; False when it is no longer due."""
        with self._lock:
            cur = self._db.execute(
                "UPDATE instances SET status = 'running', wake_at = NULL, waiting_for = NULL, updated = ?"
                " WHERE account = ? AND workflow = ? AND id = ? AND generation = ?"
                " AND (status IN ('queued', 'running') OR (status = 'waiting' AND wake_at <= ?))",
                (self.clock(), account, workflow, ident, generation, self.clock()),
            )
            return cur.rowcount == 1

    def finish(self, account: str, workflow: str, ident: str, generation: int, status: str,
               output: str | None = None, error: dict | None = None) -> bool:  # fmt: skip
        """The run ended the instance (complete or errored), unless it was paused, terminated or
        restarted meanwhile."""
        with self._lock:
            if not self._running(account, workflow, ident, generation):
                return False  # paused, terminated or restarted meanwhile: nothing is kept
            if output is not None:
                try:
                    self.charge(account, len(output), "the output of run()")
                except BindingError as exc:
                    output, status, error = None, "errored", {"name": exc.type, "message": str(exc)}
            cur = self._db.execute(
                "UPDATE instances SET status = ?, output = ?, error = ?, updated = ?, wake_at = NULL"
                " WHERE account = ? AND workflow = ? AND id = ? AND generation = ? AND status = 'running'",
                (status, output, json.dumps(error) if error else None, self.clock(), account, workflow, ident,
                 generation),
            )  # fmt: skip
            return cur.rowcount == 1

    def interrupt(self, account: str, workflow: str, ident: str, generation: int,
                  step: tuple[str, int] | None, config: StepConfig | None, message: str) -> str:  # fmt: skip
        """The run was cut (`step` ran past its timeout, the isolate past a limit): that step
        counts a failed attempt, retried as its config says ("retry"), else the instance errors
        ("errored"); no step in flight: it errors."""
        with self._lock:
            if not self._running(account, workflow, ident, generation):
                return "gone"
            if step is not None and config is not None:
                reply = self._fail(account, workflow, ident, step[0], step[1], message, False, config)
                if reply["state"] in ("retry", "wait", "suspend"):
                    return "retry"
            self.finish(
                account, workflow, ident, generation, "errored", error={"name": "Error", "message": message}
            )
            return "errored"

    def state(self, account: str, workflow: str, ident: str) -> tuple[str, int] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT status, generation FROM instances WHERE account = ? AND workflow = ? AND id = ?",
                (account, workflow, ident),
            ).fetchone()
        return (row[0], row[1]) if row else None

    # --- the run's side (what step.do, step.sleep and step.wait_for_event ask) ---------------------

    def step_call(self, account: str, workflow: str, ident: str, generation: int, method: str,
                  args: list) -> dict[str, Any]:  # fmt: skip
        if not isinstance(args, list):
            raise BindingError("TypeError", "a step call's arguments are a list")
        name, n = step_key(args)
        with self._lock:
            if not self._running(account, workflow, ident, generation):
                return SUSPEND  # paused, terminated or restarted: this run ends here
            if method == "do":
                return self._do(
                    account, workflow, ident, name, n, StepConfig(args[2] if len(args) > 2 else {})
                )
            if method == "done":
                return self._done(account, workflow, ident, name, n, args[2] if len(args) > 2 else None)
            if method == "fail":
                message = str(args[2])[:4096] if len(args) > 2 else "Error"
                nonretryable = len(args) > 3 and args[3] is True
                config = StepConfig(args[4]) if len(args) > 4 else None
                return self._fail(account, workflow, ident, name, n, message, nonretryable, config)
            if method == "sleep":
                return self._sleep(account, workflow, ident, name, n, args[2] if len(args) > 2 else None)
            if method == "wait":
                return self._wait(account, workflow, ident, name, n, args[2:])
        raise BindingError("TypeError", f"no step call {method!r}")

    def _running(self, account: str, workflow: str, ident: str, generation: int) -> bool:
        row = self._db.execute(
            "SELECT status, generation FROM instances WHERE account = ? AND workflow = ? AND id = ?",
            (account, workflow, ident),
        ).fetchone()
        return row is not None and row[0] == "running" and row[1] == generation

    def _step(self, key: tuple, kind: str) -> tuple | None:
        row = self._db.execute(
            "SELECT kind, attempts, running, done, failed, nonretryable, result, error, until FROM steps"
            " WHERE account = ? AND workflow = ? AND id = ? AND name = ? AND n = ?",
            key,
        ).fetchone()
        if row is not None and row[0] != kind:
            raise BindingError(
                "Error",
                f"step {key[3]!r} was a {row[0]} step when this instance ran before, and is a {kind} step "
                "now: a workflow's steps must come in the same order on every run (keep names of one kind)",
            )
        if row is None:
            count = self._db.execute(
                "SELECT count(*) FROM steps WHERE account = ? AND workflow = ? AND id = ?", key[:3]
            ).fetchone()[0]
            if count >= MAX_STEPS:
                raise BindingError("RangeError", f"an instance runs at most {MAX_STEPS} steps")
            self._db.execute(
                "INSERT INTO steps (account, workflow, id, name, n, kind, started)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (*key, kind, self.clock()),
            )
        return row

    def _set(self, key: tuple, **values: Any) -> None:
        cols = ", ".join(f"{k} = ?" for k in values)
        self._db.execute(
            f"UPDATE steps SET {cols} WHERE account = ? AND workflow = ? AND id = ? AND name = ? AND n = ?",
            (*values.values(), *key),
        )

    def _wake(self, key: tuple, at: float, event: str | None = None) -> dict[str, Any]:
        self._db.execute(
            "UPDATE instances SET status = 'waiting', wake_at = ?, waiting_for = ?, updated = ?"
            " WHERE account = ? AND workflow = ? AND id = ?",
            (at, event, self.clock(), *key[:3]),
        )
        return SUSPEND

    def _do(self, account: str, workflow: str, ident: str, name: str, n: int, config: StepConfig) -> dict:
        key = (account, workflow, ident, name, n)
        row = self._step(key, "do")
        now = self.clock()
        if row is not None:
            _, attempts, _, done, failed, nonretryable, result, error, until = row
            if done:
                return {"state": "done", "result": json.loads(result)}
            if failed:
                return {"state": "failed", "error": error, "nonretryable": bool(nonretryable)}
            if attempts > config.limit:  # its config was lowered since: no attempt left
                self._set(key, failed=1, finished=now)
                return {"state": "failed", "error": error or "no attempts left", "nonretryable": False}
            if until is not None and until > now:  # waiting out a retry delay
                left = (until - now) * 1000
                return {"state": "wait", "ms": left} if left <= INLINE_WAIT_MS else self._wake(key, until)
        self._db.execute(
            "UPDATE steps SET attempts = attempts + 1, running = 1, until = NULL, started = ?"
            " WHERE account = ? AND workflow = ? AND id = ? AND name = ? AND n = ?",
            (now, *key),
        )
        attempt = (row[1] if row else 0) + 1
        return {"state": "run", "attempt": attempt, "timeout_ms": config.timeout_ms}

    def _done(self, account: str, workflow: str, ident: str, name: str, n: int, value: Any) -> dict:
        key = (account, workflow, ident, name, n)
        row = self._step(key, "do")
        if row is not None and row[3]:
            return {"state": "done", "result": json.loads(row[6])}
        data = json_value(f"the result of step {name!r}", value, "store it in KV or R2 and return its key")
        self.charge(account, len(data), f"the result of step {name!r}")
        self._set(key, done=1, running=0, result=data, finished=self.clock())
        return {"state": "done"}

    def _fail(self, account: str, workflow: str, ident: str, name: str, n: int, message: str,
              nonretryable: bool, config: StepConfig | None) -> dict:  # fmt: skip
        key = (account, workflow, ident, name, n)
        row = self._step(key, "do")
        attempts = row[1] if row else 1
        now = self.clock()
        if row is not None and row[3]:
            return {"state": "done"}
        limit = config.limit if config is not None else 0
        if nonretryable or attempts > limit:
            self._set(key, running=0, failed=1, nonretryable=int(nonretryable), error=message, finished=now)
            return {"state": "failed", "error": message, "nonretryable": nonretryable}
        delay = config.delay_after(attempts) if config is not None else 0
        self._set(key, running=0, error=message, until=now + delay / 1000)
        return {"state": "retry", "delay_ms": delay}

    def _sleep(self, account: str, workflow: str, ident: str, name: str, n: int, when: Any) -> dict:
        key = (account, workflow, ident, name, n)
        row = self._step(key, "sleep")
        now = self.clock()
        if row is not None and row[3]:
            return {"state": "done"}
        if row is not None and row[8] is not None:
            until = row[8]  # the wake time it was first given, kept across runs
        else:
            if not isinstance(when, dict) or not ({"ms"} == set(when) or {"until_ms"} == set(when)):
                raise BindingError("TypeError", "a sleep names {ms} or {until_ms}")
            value = when.get("ms", when.get("until_ms"))
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise BindingError("TypeError", "a sleep's time is a number of ms")
            until = (
                now + min(value, MAX_MS) / 1000 if "ms" in when else min(value / 1000, now + MAX_MS / 1000)
            )
            self._set(key, until=until)
        if until <= now:
            self._set(key, done=1, finished=now)
            return {"state": "done"}
        return self._wake(key, until)

    def _wait(self, account: str, workflow: str, ident: str, name: str, n: int, rest: list) -> dict:
        key = (account, workflow, ident, name, n)
        if (
            len(rest) != 2
            or not isinstance(rest[0], str)
            or isinstance(rest[1], bool)
            or not isinstance(rest[1], int)
        ):
            raise BindingError("TypeError", "wait_for_event names an event type and a timeout in ms")
        kind, timeout_ms = rest
        row = self._step(key, "event")
        now = self.clock()
        if row is not None and row[3]:
            return {"state": "done", "result": json.loads(row[6])}
        if row is not None and row[4]:
            return {"state": "timeout"}
        until = (
            row[8] if row is not None and row[8] is not None else now + min(max(timeout_ms, 0), MAX_MS) / 1000
        )
        if row is None or row[8] is None:
            self._set(key, until=until)
        event = self._db.execute(
            "SELECT seq, payload, sent FROM events WHERE account = ? AND workflow = ? AND id = ? AND type = ?"
            " AND taken = 0 ORDER BY seq LIMIT 1",
            (*key[:3], kind),
        ).fetchone()
        if event is not None:
            self._db.execute("DELETE FROM events WHERE seq = ?", (event[0],))  # it is the step's now
            result = {"type": kind, "payload": json.loads(event[1]), "timestamp": int(event[2] * 1000)}
            data = json.dumps(result)
            self._db.execute(
                "UPDATE usage SET bytes = bytes - ? + ? WHERE account = ?",
                (len(event[1]), len(data), account),
            )
            self._set(key, done=1, result=data, finished=now)
            return {"state": "done", "result": result}
        if until <= now:
            self._set(key, failed=1, error=f"no {kind!r} event within the timeout", finished=now)
            return {"state": "timeout"}
        return self._wake(key, until, kind)
