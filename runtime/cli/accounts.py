"""`edge accounts create|list|update` and `edge tokens create|list|revoke`: a running runtime's
accounts through its control endpoints (runtime.routes.accounts), with the admin token found as
the other control commands find it ($EDGE_ADMIN_TOKEN, else the config's .edge/admin-token).

A new API token is printed once, alone on stdout (so `TOKEN=$(edge tokens create acme)` works);
what was done goes to stderr."""

from __future__ import annotations

import argparse
import sys
from typing import Any
from urllib.parse import quote

from runtime.cli.client import admin_headers
from runtime.cli.common import _fail
from runtime.control.config import ConfigError

PATH = "/cdn-cgi/edge/accounts"
SETTINGS = ("rpm", "tpm", "weight", "kv_share")


def _call(args: argparse.Namespace, method: str, path: str, body: dict | None = None) -> dict[str, Any]:
    """The control endpoint's answer; ConfigError with its message when it refuses."""
    import httpx

    headers = admin_headers(args.config)
    try:
        r = httpx.request(method, args.url.rstrip("/") + path, json=body, headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        raise ConfigError(f"cannot reach the runtime at {args.url} ({exc}); is edge dev running?") from None
    try:
        answer = r.json()
    except ValueError:
        raise ConfigError(f"the runtime answered {r.status_code}: {r.text[:200]}") from None
    if r.status_code >= 400:
        raise ConfigError(answer.get("error", {}).get("message", r.text[:200]))
    return answer


def _settings(args: argparse.Namespace) -> dict[str, Any]:
    """The settings given on the command line (those left out are not sent)."""
    given = {key: getattr(args, key) for key in SETTINGS if getattr(args, key) is not None}
    if given.get("tpm") == "unlimited":
        given["tpm"] = None
    return given


def _tpm(text: str) -> int | str:
    if text.lower() in ("unlimited", "none"):
        return "unlimited"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: a whole number, or 'unlimited'") from None


def _describe(account: dict[str, Any]) -> str:
    tpm = "unlimited" if account["tpm"] is None else account["tpm"]
    return f"rpm {account['rpm']}, tpm {tpm}, weight {account['weight']:g}, kv_share {account['kv_share']:g}"


def cmd_accounts(args: argparse.Namespace) -> int:
    try:
        if args.action == "list":
            accounts = _call(args, "GET", PATH)["accounts"]
            rows = [("ACCOUNT", "RPM", "TPM", "WEIGHT", "KV_SHARE", "TOKENS")]
            for a in accounts:
                tpm = "unlimited" if a["tpm"] is None else str(a["tpm"])
                tokens = ", ".join(t["name"] for t in a["tokens"]) or "-"
                rows.append((a["id"], str(a["rpm"]), tpm, f"{a['weight']:g}", f"{a['kv_share']:g}", tokens))
            widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
            for row in rows:
                print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=False)) + "  " + row[-1])
            return 0
        settings = _settings(args)
        if args.action == "create":
            answer = _call(args, "POST", PATH, {"name": args.name, **settings})
            print(f"created account {args.name}: {_describe(answer['account'])}", file=sys.stderr)
            print("its API token (shown once; only its hash is kept):", file=sys.stderr)
            print(answer["token"]["token"], flush=True)
            return 0
        if not settings:
            return _fail("edge accounts update NAME needs at least one of --rpm, --tpm, --weight, --kv-share")
        answer = _call(args, "PATCH", f"{PATH}/{quote(args.name, safe='')}", settings)
        print(f"updated account {args.name}: {_describe(answer['account'])}")
        return 0
    except ConfigError as exc:
        return _fail(str(exc))


def cmd_tokens(args: argparse.Namespace) -> int:
    try:
        path = f"{PATH}/{quote(args.account, safe='')}/tokens"
        if args.action == "list":
            import time

            for t in _call(args, "GET", path)["tokens"]:
                print(f"{t['name']}  {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(t['created']))}")
            return 0
        if args.action == "create":
            answer = _call(args, "POST", path, {"name": args.name} if args.name else None)
            print(
                f"created token {answer['name']!r} for account {args.account} (shown once):", file=sys.stderr
            )
            print(answer["token"], flush=True)
            return 0
        answer = _call(args, "DELETE", f"{path}/{quote(args.name, safe='')}")
        print(f"revoked token {args.name!r} of account {args.account} ({answer['revoked']} token(s))")
        return 0
    except ConfigError as exc:
        return _fail(str(exc))


def add_account_parsers(sub) -> None:
    """edge accounts create|list|update and edge tokens create|list|revoke."""

    def control_args(p):
        p.add_argument(
            "--config", default=None, help="its .edge/admin-token is sent (default: as edge dev finds it)"
        )
        p.add_argument("--url", default="http://127.0.0.1:8787", help="the running runtime")

    def setting_args(p, defaults: dict[str, str] | None):
        def default(key: str) -> str:
            return f"(default: {defaults[key]})" if defaults else "(default: unchanged)"

        p.add_argument("--rpm", type=int, help=f"requests per minute per model {default('rpm')}")
        p.add_argument(
            "--tpm", type=_tpm, help=f"tokens per minute per model, or 'unlimited' {default('tpm')}"
        )
        p.add_argument("--weight", type=float, help=f"fair-share weight, above 0 {default('weight')}")
        p.add_argument(
            "--kv-share",
            dest="kv_share",
            type=float,
            help=f"fraction of a PoP's KV blocks, in (0, 1] {default('kv')}",
        )

    acc = sub.add_parser("accounts", help="create, list and update a running runtime's accounts (admin)")
    acc_sub = acc.add_subparsers(dest="action", required=True)
    create = acc_sub.add_parser("create", help="a new account; prints its API token once")
    create.add_argument("name", help="1-63 characters of a-z, 0-9, '_' and '-'")
    setting_args(create, {"rpm": "300", "tpm": "unlimited", "weight": "1", "kv": "1"})
    lst = acc_sub.add_parser("list", help="the accounts, their settings and token names")
    update = acc_sub.add_parser("update", help="change an account's settings")
    update.add_argument("name", help="the account")
    setting_args(update, None)
    for p in (create, lst, update):
        control_args(p)
        p.set_defaults(func=cmd_accounts)

    tok = sub.add_parser("tokens", help="create, list and revoke an account's API tokens (admin)")
    tok_sub = tok.add_subparsers(dest="action", required=True)
    tcreate = tok_sub.add_parser("create", help="a new API token for ACCOUNT, printed once")
    tcreate.add_argument("account", help="the account")
    tcreate.add_argument("--name", help="the token's name (default: token-N)")
    tlist = tok_sub.add_parser("list", help="ACCOUNT's token names and when each was made")
    tlist.add_argument("account", help="the account")
    revoke = tok_sub.add_parser("revoke", help="revoke ACCOUNT's token(s) named NAME")
    revoke.add_argument("account", help="the account")
    revoke.add_argument("name", help="the token's name (edge tokens list ACCOUNT)")
    for p in (tcreate, tlist, revoke):
        control_args(p)
        p.set_defaults(func=cmd_tokens)
