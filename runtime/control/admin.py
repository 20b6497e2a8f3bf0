"""The control plane's credential: the admin token that `/cdn-cgi/edge/*` state-changing and
state-revealing endpoints require, as `Authorization: Bearer <admin token>`.

It comes from $EDGE_ADMIN_TOKEN, else from `.edge/admin-token` (written, mode 600 in a mode 700
state dir, and printed once, at the first start of `edge dev`). It is not an account's API token:
an API token never opens the control plane, and the admin token never acts for an account.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from edge_sim.http_guard import bearer_ok, read_capped

ADMIN_TOKEN_ENV = "EDGE_ADMIN_TOKEN"
ADMIN_TOKEN_FILE = "admin-token"
CONTROL_BODY_BYTES = 64 * 1024  # a control request is a few bytes of JSON
HOW_TO = (
    f"send Authorization: Bearer <admin token>; it is in .edge/{ADMIN_TOKEN_FILE} "
    f"(edge dev writes it at first start) or ${ADMIN_TOKEN_ENV}"
)

__all__ = [
    "ADMIN_TOKEN_ENV",
    "CONTROL_BODY_BYTES",
    "HOW_TO",
    "bootstrap_admin_token",
    "check_admin",
    "find_admin_token",
    "read_capped",
]


def bootstrap_admin_token(state_dir: Path) -> tuple[str, bool]:
    """$EDGE_ADMIN_TOKEN, else the one saved at first start, else a new one saved under the
    state dir (never committed). Returns (token, newly created)."""
    state_dir.mkdir(parents=True, exist_ok=True)
    state_dir.chmod(0o700)  # the database, the tokens and the scripts: the runtime's alone
    env = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if env:
        return env, False
    path = state_dir / ADMIN_TOKEN_FILE
    if path.is_file() and path.read_text().strip():
        path.chmod(0o600)
        return path.read_text().strip(), False
    token = "edgeadm_" + secrets.token_urlsafe(32)
    path.unlink(missing_ok=True)  # an empty leftover
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never readable by others
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


def find_admin_token(state_dir: Path | None) -> str | None:
    """The CLI's side: $EDGE_ADMIN_TOKEN, else the state dir's admin-token file (if one is given)."""
    env = os.environ.get(ADMIN_TOKEN_ENV, "").strip()
    if env or state_dir is None:
        return env or None
    path = state_dir / ADMIN_TOKEN_FILE
    try:
        return path.read_text().strip() or None
    except OSError:
        return None


def check_admin(authorization: str | None, expected: str | None) -> tuple[int, str] | None:
    """None when the header carries the admin token; else (status, message): 401 without a
    Bearer token, 403 with a wrong one (or when this runtime has no admin token at all)."""
    header = (authorization or "").strip()
    if not header.lower().startswith("bearer ") or not header[7:].strip():
        return 401, f"this is a control endpoint: {HOW_TO}"
    if not expected or not bearer_ok(header, expected):
        return 403, f"that is not the admin token: {HOW_TO}"
    return None
