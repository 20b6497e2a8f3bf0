"""AI Gateway's state in the shapes Cloudflare's API answers it (the `cloudflare` SDK's types): a
gateway (types/ai_gateway/ai_gateway_get_response.py) and a log row (log_list_response.py,
log_get_response.py). The store keeps a row as the runtime made it, which env.AI.gateway(id).getLog
answers as workerd's AiGatewayLog (metadata an object); the REST API answers it here, each field of
the SDK's type: `created_at` an ISO-8601 time, `duration` whole milliseconds, `metadata` JSON text,
`cost` a number, the counts integers, so the SDK reads a row without a warning."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

# the SDK's fields of a log row, each made of the stored row's (api_log_row); the rest pass as they are
_INTS = ("status_code", "step")
_OPTIONAL_INTS = ("tokens_in", "tokens_out")


def iso_time(seconds: float) -> str:
    """A Unix time as Cloudflare writes one: 2026-01-31T12:00:00.123Z."""
    return datetime.fromtimestamp(seconds, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def api_log_row(entry: dict[str, Any]) -> dict[str, Any]:
    """A stored log row as the REST API answers it. Fields the SDK does not name (tags, error,
    attempts, score, feedback, event and request ids, the bodies' sizes and heads) are kept as
    they are: the SDK's models take extra fields."""
    row = dict(entry)
    row["created_at"] = iso_time(float(entry.get("created_at") or 0))
    row["duration"] = round(entry.get("duration") or 0)
    for name in _INTS:
        row[name] = int(entry.get(name) or 0)
    for name in _OPTIONAL_INTS:
        row[name] = None if entry.get(name) is None else int(entry[name])
    row["success"], row["cached"] = bool(entry.get("success")), bool(entry.get("cached"))
    row["cost"] = float(entry.get("cost") or 0.0)  # nothing is billed here
    row["custom_cost"] = bool(entry.get("custom_cost", False))
    for name in ("model", "path", "provider"):
        row[name] = str(entry.get(name) or "")
    metadata = entry.get("metadata")
    row["metadata"] = json.dumps(metadata) if metadata else None
    return row


def api_gateway(gateway_id: str, settings: dict[str, Any], created: float, modified: float) -> dict[str, Any]:
    """A gateway as the API answers it: its id, its settings (GatewaySettings.to_api) and times."""
    return {
        "id": gateway_id,
        **settings,
        "created_at": iso_time(created),
        "modified_at": iso_time(modified),
    }
