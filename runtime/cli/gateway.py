"""`edge gateway logs GATEWAY [--account A] [--limit N] [--json]`: an AI Gateway's newest logs, newest
first, over the running runtime's REST API (runtime.routes.gateway_rest: pages of at most 50, as
Cloudflare's log list gives them) with the account's API token
($EDGE_API_TOKEN, else the one `edge dev` saved), as AI Gateway's dashboard lists them. `--account`
names another account than the config's; its token must be that account's."""

from __future__ import annotations

import argparse
import json
from datetime import datetime

from runtime.cli.client import Client
from runtime.cli.common import _fail
from runtime.control.config import ConfigError

MAX_LIMIT = 1000
PAGE = 50  # the log list's largest page (runtime.ai.gateway_log_query.MAX_PER_PAGE)


def cmd_gateway(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= MAX_LIMIT:
        return _fail(f"--limit: give 1 to {MAX_LIMIT}")
    try:
        client = Client(args)
        if getattr(args, "account", None):
            client.account = args.account
        rows: list[dict] = []
        while len(rows) < args.limit:
            page = client.call(
                "GET",
                f"/ai-gateway/gateways/{args.gateway}/logs",
                params={"page": len(rows) // PAGE + 1, "per_page": PAGE},
            )
            rows += page[: args.limit - len(rows)]
            if len(page) < PAGE:
                break
    except ConfigError as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"gateway {args.gateway} of {client.account}: no logs yet")
        return 0
    for row in rows:
        print(_line(row))
    return 0


def _line(row: dict) -> str:
    """One log row for a terminal: when, its id, the model, ok or the error's status, cached or not,
    how long, tokens in+out, its step (a universal run's) and tags."""
    created = datetime.fromisoformat(row.get("created_at") or "1970-01-01T00:00:00Z")
    when = created.astimezone().strftime("%Y-%m-%d %H:%M:%S")  # the terminal's local time
    outcome = "ok" if row.get("success") else f"error {row.get('status_code')}"
    cached = " cached" if row.get("cached") else ""
    tokens = ""
    if row.get("tokens_in") is not None or row.get("tokens_out") is not None:
        tokens = f"  {row.get('tokens_in') or 0}+{row.get('tokens_out') or 0} tokens"
    step = f"  step {row['step']}" if row.get("step") else ""
    tags = f"  tags={','.join(row['tags'])}" if row.get("tags") else ""
    duration = f"{row.get('duration') or 0:.0f} ms"
    return f"{when}  {row['id']}  {row.get('model', '')}  {outcome}{cached}  {duration}{tokens}{step}{tags}"


def add_gateway_parsers(sub, client_args) -> None:
    gw = sub.add_parser("gateway", help="an AI Gateway's logs")
    gw.add_argument("action", choices=["logs"], help="what to show")
    gw.add_argument("gateway", help="the gateway's id (as env.AI.run's gateway option names it)")
    gw.add_argument("--account", help="the account whose gateway it is (default: the config's account_id)")
    gw.add_argument(
        "--limit", type=int, default=50, help=f"the newest N logs (default 50, at most {MAX_LIMIT})"
    )
    gw.add_argument("--json", action="store_true", help="the rows as JSON")
    client_args(gw)
    gw.set_defaults(func=cmd_gateway)
