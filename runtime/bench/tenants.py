"""The accounts and API tokens benchmark requests are spread over (round-robin, request i to
tenant i mod N).

`--tenants N --admin-token T`: N fresh accounts `bench-<6 hex>-<i>` made through the control
plane (POST /cdn-cgi/edge/accounts, as `edge accounts create` does), each with its first token,
optionally with `--tenant-rpm` / `--tenant-tpm`; they stay (there is no delete), each benchmark
makes new ones. `--api-keys a,b,c`: given tokens, each `ACCOUNT=TOKEN` or a bare token of
`--account`. Neither: one tenant, `--api-key` (else $EDGE_API_TOKEN, else the project's
.edge/api-token, as the other client commands find it) acting for `--account` (else the config's)."""

from __future__ import annotations

import os
import secrets
from typing import Any

import httpx

import runtime.bindings.kinds  # noqa: F401 - the binding kinds' tables the config reads
from runtime.bench.clients import Tenant
from runtime.control.config import ConfigError, load_config

ACCOUNTS_PATH = "/cdn-cgi/edge/accounts"


def parse_api_keys(text: str, account: str) -> list[Tenant]:
    out = []
    for item in (x.strip() for x in text.split(",")):
        if not item:
            continue
        name, sep, token = item.partition("=")
        out.append(Tenant(name, token) if sep else Tenant(account, item))
    if not out:
        raise ConfigError("--api-keys: give at least one token (ACCOUNT=TOKEN or TOKEN)")
    return out


def create_tenants(
    base_url: str, admin_token: str, n: int, settings: dict[str, Any] | None = None
) -> list[Tenant]:
    """`n` new accounts and their tokens; ConfigError with the control plane's message."""
    if n < 1:
        raise ConfigError(f"--tenants must be at least 1, got {n}")
    run = secrets.token_hex(3)
    headers = {"authorization": f"Bearer {admin_token}"}
    out = []
    for i in range(n):
        body = {"name": f"bench-{run}-{i}", **(settings or {})}
        try:
            r = httpx.post(base_url + ACCOUNTS_PATH, json=body, headers=headers, timeout=30)
        except httpx.HTTPError as exc:
            raise ConfigError(
                f"cannot reach the runtime at {base_url} ({exc}); is edge dev running?"
            ) from None
        if r.status_code != 201:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text[:200]
            raise ConfigError(f"creating tenant account {body['name']}: {r.status_code} {message}")
        out.append(Tenant(body["name"], r.json()["token"]["token"]))
    return out


def default_tenant(api_key: str | None, account: str | None, config_path: str | None) -> Tenant:
    """The one tenant of a run without --tenants or --api-keys."""
    token = api_key or os.environ.get("EDGE_API_TOKEN")
    if token and account:
        return Tenant(account, token)
    config = load_config(config_path)
    path = config.state_dir / "api-token"
    if not token and path.is_file():
        token = path.read_text().strip()
    if not token:
        raise ConfigError(
            f"no API token: pass --api-key, set EDGE_API_TOKEN, or run `edge dev` once "
            f"(it saves one in {path})"
        )
    return Tenant(account or config.account_id, token)


def pick(tenants: list[Tenant], i: int) -> Tenant:
    return tenants[i % len(tenants)]
