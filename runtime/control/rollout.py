"""A canary rollout of a new model version: a share of the traffic, sticky per session key.

`edge models rollout` (runtime.cli.rollout) starts one over the control plane: every in-process
PoP loads NEW beside the serving version under the canary name `MODEL#canary`, and calls whose
`x-session-affinity` key hashes into the first `share` percent are served by it (the same key
always lands on the same side; calls without a key stay on the baseline). Finishing it promotes
NEW (every PoP loads it under the model's own name) or rolls back (the canary is unloaded); either
way the decision and its reasons go to the dev worker's tail, to /metrics
(edge_model_rollouts_total) and to the model's history (promotions.jsonl beside NEW)."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path
from typing import Any

import msgspec

from runtime.control.tail import log_event

CANARY_SUFFIX = "#canary"


class Canary(msgspec.Struct):
    model: str  # the catalog name it is a candidate for
    new: str  # the new version's model directory
    share: float  # percent of session keys it serves
    started: float = 0.0


def canary_name(model: str) -> str:
    return model + CANARY_SUFFIX


def in_canary(session: str | None, share: float) -> bool:
    """Whether a session key falls in the canary's share (stable: a hash of the key)."""
    if not session or share <= 0:
        return False
    bucket = int.from_bytes(hashlib.sha256(session.encode()).digest()[:8], "big") % 10_000
    return bucket < share * 100


class Rollouts:
    """The canaries in progress, by the model they are candidates for."""

    def __init__(self) -> None:
        self.canaries: dict[str, Canary] = {}

    def route(self, model: str, session: str | None) -> str:
        """The name that serves this call: the canary's for a session in its share, else `model`."""
        canary = self.canaries.get(model)
        return canary_name(model) if canary is not None and in_canary(session, canary.share) else model


def history_path(new: str | Path, record: str | Path | None = None) -> Path:
    """The model's history: `record` if given, else promotions.jsonl beside the new version."""
    return Path(record) if record else Path(new).parent / "promotions.jsonl"


def append_history(path: Path, entry: dict[str, Any]) -> None:
    """One decision (promote's or rollout's) as a JSON line, stamped with when it was made."""
    entry = {**entry, "at": entry.get("at") or time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    with open(path, "a") as f:
        f.write(json.dumps(entry) + "\n")


def rollout_event(script: str, model: str, decision: str, reasons: list[str], new: str) -> dict[str, Any]:
    """The tail event of a rollout decision: a log line, and the decision itself under `rollout`."""
    message = f"model rollout {decision}: {model} -> {new}" + (f" ({'; '.join(reasons)})" if reasons else "")
    level = "warn" if decision == "rolled_back" else "info"
    event = log_event(script, [{"level": level, "message": [message], "timestamp": int(time.time() * 1000)}])
    event["rollout"] = {"model": model, "new": new, "decision": decision, "reasons": reasons}
    return event
