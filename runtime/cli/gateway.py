"""`edge gateway logs GATEWAY [--limit N] [--json]`: an AI Gateway's newest logs (runtime.routes.gateway),
over the running runtime's API with the account's API token, as AI Gateway's dashboard lists them."""

from __future__ import annotations

import argparse
import json
import time

from runtime.cli.client import Client
from runtime.cli.common import _fail
from runtime.control.config import ConfigError


def cmd_gateway(args: argparse.Namespace) -> int:
    if not 1 <= args.limit <= 1000:
        return _fail("--limit: give 1 to 1000")
    try:
        rows = Client(args).call(
            "GET", f"/ai-gateway/gateways/{args.gateway}/logs", params={"per_page": args.limit}
        )
    except ConfigError as exc:
        return _fail(str(exc))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"gateway {args.gateway}: no logs yet")
        return 0
    for row in rows:
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row["created_at"]))
        outcome = "ok" if row["success"] else f"error {row['status_code']}"
        cached = " cached" if row["cached"] else ""
        tokens = f" {row['tokens_in']}+{row['tokens_out']} tokens" if row["tokens_in"] is not None else ""
        tags = f" tags={','.join(row['tags'])}" if row["tags"] else ""
        print(
            f"{when}  {row['id']}  {row['model']}  {outcome}{cached}  {row['duration']:.0f} ms{tokens}{tags}"
        )
    return 0


def add_gateway_parsers(sub, client_args) -> None:
    gw = sub.add_parser("gateway", help="an AI Gateway's logs")
    gw.add_argument("action", choices=["logs"], help="what to show")
    gw.add_argument("gateway", help="the gateway's id (as env.AI.run's gateway option names it)")
    gw.add_argument("--limit", type=int, default=50, help="the newest N logs (default 50)")
    gw.add_argument("--json", action="store_true", help="the rows as JSON")
    client_args(gw)
    gw.set_defaults(func=cmd_gateway)
