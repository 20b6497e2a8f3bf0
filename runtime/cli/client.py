"""The API and admin tokens, and the CLI's HTTP client for a running runtime's control plane."""

from __future__ import annotations

import argparse

from runtime.control.config import ConfigError, WorkerConfig, load_config

TOKEN_ENV = "EDGE_API_TOKEN"


def bootstrap_token(config: WorkerConfig, state) -> tuple[str, bool]:
    """The dev account's API token: $EDGE_API_TOKEN, else the one saved at first start, else a
    new one (saved under .edge/, which is never committed). Returns (token, newly created)."""
    import os

    state.ensure_account(config.account_id)
    path = config.state_dir / "api-token"
    env = os.environ.get(TOKEN_ENV)
    if env:
        state.add_token(config.account_id, env)
        return env, False
    if path.is_file() and state.account_for(path.read_text().strip()) == config.account_id:
        return path.read_text().strip(), False
    token = state.create_token(config.account_id, "edge dev")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token, True


def admin_headers(config_path: str | None) -> dict[str, str]:
    """The admin token for the control endpoints: $EDGE_ADMIN_TOKEN, else the config's
    .edge/admin-token (edge dev writes it at first start). Raises ConfigError when neither exists."""
    from runtime.control.admin import ADMIN_TOKEN_ENV, find_admin_token

    token = find_admin_token(None)  # the environment's, if any
    path = None
    if not token:
        try:
            state_dir = load_config(config_path).state_dir
        except ConfigError as exc:
            raise ConfigError(f"no admin token: set {ADMIN_TOKEN_ENV}, or pass --config ({exc})") from None
        path = state_dir / "admin-token"
        token = find_admin_token(state_dir)
    if not token:
        raise ConfigError(
            f"no admin token: set {ADMIN_TOKEN_ENV}, or run `edge dev` once (it saves one in {path})"
        )
    return {"authorization": f"Bearer {token}"}


class Client:
    """The CLI's side of the runtime's HTTP APIs (token from $EDGE_API_TOKEN or .edge/api-token)."""

    def __init__(self, args: argparse.Namespace):
        import os

        self.config = load_config(args.config)
        self.url = args.url.rstrip("/")
        token = os.environ.get(TOKEN_ENV)
        path = self.config.state_dir / "api-token"
        if not token and path.is_file():
            token = path.read_text().strip()
        if not token:
            raise ConfigError(
                f"no API token: set {TOKEN_ENV}, or run `edge dev` once (it saves one in {path})"
            )
        self.headers = {"authorization": f"Bearer {token}"}
        self.account = self.config.account_id

    def call(self, method: str, path: str, **kw):
        import httpx

        try:
            r = httpx.request(
                method,
                f"{self.url}/client/v4/accounts/{self.account}{path}",
                headers=self.headers,
                timeout=kw.pop("timeout", 120),
                **kw,
            )
        except httpx.HTTPError as exc:
            raise ConfigError(
                f"cannot reach the runtime at {self.url} ({exc}); is edge dev running?"
            ) from None
        body = r.json()
        if not body.get("success", True):
            raise ConfigError("; ".join(f"{e['code']}: {e['message']}" for e in body["errors"]))
        return body.get("result", body)
