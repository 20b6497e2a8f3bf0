"""Commands that talk HTTP to a running runtime: deploy, versions, deployments, rollback, secret,
tail, ai run, pop down|up|list and models reload."""

from __future__ import annotations

import argparse
import sys

from runtime.bindings.kinds import upload_payload
from runtime.cli.client import Client, admin_headers
from runtime.cli.common import CONFIG_HELP, _fail
from runtime.cli.gateway import add_gateway_parsers
from runtime.cli.workflows import add_workflow_parsers
from runtime.control.config import ConfigError, WorkerConfig


def bundle(config: WorkerConfig) -> dict[str, str]:
    """The worker's main module and its local modules (every .py beside it)."""
    root = config.main_path.parent
    skip = {".edge", "__pycache__", ".venv", ".git"}
    return {
        p.relative_to(root).as_posix(): p.read_text()
        for p in sorted(root.rglob("*.py"))
        if not skip & set(p.relative_to(root).parts)
    }


def cmd_deploy(args: argparse.Namespace) -> int:
    try:
        client = Client(args)
        c = client.config
        if c.queues.consumers:  # consumers are the runtime's, started from the config it serves
            print(
                "edge: warning: queues.consumers are not deployed: the queues this config consumes are "
                "delivered to the worker `edge dev` serves from the working tree, never to a deployed "
                "version (its queues.producers are deployed and send to the same queues)",
                file=sys.stderr,
            )
        files = bundle(c)
        payload = {
            "main": c.main_path.name,
            "files": files,
            "config": {
                "vars": dict(c.vars),
                "ai_binding": c.ai.binding if c.ai else None,
                "services": {s.binding: s.service for s in c.services},
                "cpu_ms": c.limits.cpu_ms,
                "memory_mb": c.limits.memory_mb,
                "subrequests": c.limits.subrequests,
                **upload_payload(c.bindings),
                "durable_objects": {
                    "bindings": [
                        {"name": b.name, "class_name": b.class_name, "script_name": b.script_name}
                        for b in c.durable_objects.bindings
                    ]
                },
            },
            "message": args.message,
        }
        result = client.call("PUT", f"/workers/scripts/{c.name}", json=payload)
    except ConfigError as exc:
        return _fail(str(exc))
    port = args.url.rstrip("/").rsplit(":", 1)[-1]
    print(f"deployed {c.name} version {result['id']} ({len(files)} file(s)) to account {client.account}")
    print(f"  reach it at http://{c.name}.{client.account}.edge.localhost:{port}/")
    return 0


def cmd_versions(args: argparse.Namespace) -> int:
    try:
        client = Client(args)
        name = args.name or client.config.name
        if args.action == "list":
            for v in client.call("GET", f"/workers/scripts/{name}/versions")["items"]:
                print(f"{v['id']}  {_when(v['created'])}  {v['message'] or ''}")
            return 0
        splits = []
        for item in args.splits:
            version, _, pct = item.partition("@")
            if not pct.isdigit():
                return _fail(f"{item!r}: write VERSION_ID@PERCENT, e.g. {version or 'abc'}@90")
            splits.append({"version_id": version, "percentage": int(pct)})
        result = client.call(
            "POST", f"/workers/scripts/{name}/deployments", json={"versions": splits, "message": args.message}
        )
    except ConfigError as exc:
        return _fail(str(exc))
    print(f"deployment {result['id']}: " + ", ".join(f"{s['version_id']}@{s['percentage']}%" for s in splits))
    return 0


def cmd_deployments(args: argparse.Namespace) -> int:
    try:
        client = Client(args)
        name = args.name or client.config.name
        for d in client.call("GET", f"/workers/scripts/{name}/deployments")["deployments"]:
            split = ", ".join(f"{v['version_id']}@{v['percentage']}%" for v in d["versions"])
            print(f"{d['id']}  {_when(d['created'])}  {split}  {d['message'] or ''}")
    except ConfigError as exc:
        return _fail(str(exc))
    return 0


def cmd_rollback(args: argparse.Namespace) -> int:
    try:
        client = Client(args)
        name = args.name or client.config.name
        result = client.call(
            "POST",
            f"/workers/scripts/{name}/rollback",
            json={"version_id": args.version_id, "message": args.message},
        )
    except ConfigError as exc:
        return _fail(str(exc))
    print(f"rolled back {name} to version {result['version_id']} (deployment {result['id']})")
    return 0


def cmd_secret(args: argparse.Namespace) -> int:
    import getpass

    try:
        client = Client(args)
        name = args.name or client.config.name
        if args.action == "list":
            for item in client.call("GET", f"/workers/scripts/{name}/secrets"):
                print(item["name"])
            return 0
        if not args.secret:
            return _fail(f"edge secret {args.action} needs a NAME")
        if args.action == "delete":
            client.call("DELETE", f"/workers/scripts/{name}/secrets/{args.secret}")
            print(f"deleted secret {args.secret}")
            return 0
        value = (
            getpass.getpass(f"value of {args.secret}: ")
            if sys.stdin.isatty()
            else sys.stdin.read().rstrip("\n")
        )
        client.call("PUT", f"/workers/scripts/{name}/secrets", json={"name": args.secret, "text": value})
    except ConfigError as exc:
        return _fail(str(exc))
    print(f"stored secret {args.secret} for {name} (its value is never shown or logged)")
    return 0


def cmd_tail(args: argparse.Namespace) -> int:
    import json as _json

    import httpx

    try:
        client = Client(args)
    except ConfigError as exc:
        return _fail(str(exc))
    name = args.worker or client.config.name
    params = {"status": args.status} if args.status else {}
    url = f"{client.url}/client/v4/accounts/{client.account}/workers/scripts/{name}/tail"
    try:
        with httpx.stream("GET", url, headers=client.headers, params=params, timeout=None) as r:
            if r.status_code != 200:
                return _fail(f"tail refused ({r.status_code}): {r.read().decode()[:300]}")
            for line in r.iter_lines():
                if not line.strip():
                    continue
                event = _json.loads(line)
                if event.get("type") == "connected":
                    print(f"tailing {name} (Ctrl-C to stop)", file=sys.stderr, flush=True)
                    continue
                print(_json.dumps(event) if args.format == "json" else _pretty(event), flush=True)
    except KeyboardInterrupt:
        return 0
    except httpx.HTTPError as exc:
        return _fail(f"tail connection lost: {exc}")
    return 0


def _pretty(event: dict) -> str:
    """One tail event for a terminal: the worker's text in it (log lines, exceptions, the URL)
    with control characters escaped, and its lines after the first indented under the event's."""
    from runtime.isolate.console import clean

    kind = event.get("event") or {}
    req = kind.get("request", {})
    status = kind.get("response", {}).get("status", "")
    if not req:  # a cron run, a queue batch, a Durable Object's RPC call: what it was
        named = [(k, kind[k]) for k in ("cron", "queue", "rpcMethod") if k in kind]
        req = {"method": " ".join(f"{k} {v}" for k, v in named)} if named else {}
    lines: list[str] = []

    def add(first: str, text: object, more: str) -> None:
        head, *rest = str(text).splitlines() or [""]
        lines.append(first + clean(head))
        lines.extend(more + clean(row) for row in rest)

    # eventTimestamp is in milliseconds, as Cloudflare's tail has it
    when = _when(event.get("eventTimestamp", 0) / 1000)
    head = f"[{when}] {event.get('outcome')} {req.get('method', '')} {req.get('url', '')} {status}"
    add("", head.rstrip(), "  ")
    for log in event.get("logs", []):
        add(f"  ({clean(str(log.get('level')))}) ", log.get("message", ""), "    ")
    for call in event.get("ai", []):  # AI calls through an AI Gateway: where `edge gateway logs` finds them
        if call.get("gateway"):
            cache = f", cache {call['cacheStatus']}" if call.get("cacheStatus") else ""
            add(
                "  (ai) ",
                f"{call.get('model')} via gateway {call['gateway']}: log {call.get('gatewayLogId')}{cache}",
                "    ",
            )
    for exc in event.get("exceptions", []):
        add("  ", f"{exc.get('name')}: {exc.get('message')}", "    ")
        for row in (exc.get("stack") or "").rstrip().splitlines():
            add("    ", row, "    ")
    return "\n".join(lines)


def _when(ts: float) -> str:
    import time

    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


def cmd_ai_run(args: argparse.Namespace) -> int:
    import json as _json

    try:
        client = Client(args)
        inputs = {"prompt": args.prompt, "max_tokens": args.max_tokens, "temperature": args.temperature}
        if args.stream:
            import httpx

            url = f"{client.url}/client/v4/accounts/{client.account}/ai/run/{args.model}"
            with httpx.stream(
                "POST", url, headers=client.headers, json={**inputs, "stream": True}, timeout=300
            ) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        print(_json.loads(line[6:]).get("response", ""), end="", flush=True)
            print()
            return 0
        result = client.call("POST", f"/ai/run/{args.model}", json=inputs)
    except ConfigError as exc:
        return _fail(str(exc))
    text = result["response"] if "response" in result else result["choices"][0]["message"]["content"]
    print(text)
    t = result["timing"]
    print(
        f"-- {result['usage']['completion_tokens']} tokens from {t['pop']} (ingress {t['ingress']}), "
        f"{t['total_ms']:.0f} ms; weights {result['quantization']['weights']}, "
        f"KV {result['quantization']['kv_cache']}",
        file=sys.stderr,
    )
    return 0


def cmd_models_reload(args: argparse.Namespace) -> int:
    """Have every PoP of a running `edge dev` load the catalog's current version of a model."""
    import httpx

    try:
        headers = admin_headers(args.config)
        r = httpx.post(
            args.url.rstrip("/") + "/cdn-cgi/edge/models/reload",
            json={"model": args.model},
            headers=headers,
            timeout=600,
        )
    except ConfigError as exc:
        return _fail(str(exc))
    except httpx.HTTPError as exc:
        return _fail(f"cannot reach edge dev at {args.url} ({exc}); is it running?")
    body = r.json()
    if "error" in body:
        return _fail(body["error"]["message"])
    for code, outcome in body["pops"].items():
        print(
            f"{code}: "
            + ("loaded" if outcome["loaded"] else f"REFUSED, kept the old version: {outcome['refused']}")
        )
    return 0 if r.status_code == 200 else 1


def cmd_pop(args: argparse.Namespace) -> int:
    """Take a GPU PoP of a running `edge dev` down or bring it up, or list the PoPs."""
    import httpx

    if args.action == "serve" or args.name:
        return _fail("use edge pop serve --name CODE --port N")
    base = args.url.rstrip("/") + "/cdn-cgi/edge/pops"
    try:
        headers = admin_headers(args.config)
    except ConfigError as exc:
        return _fail(str(exc))
    try:
        if args.action == "list":
            r = httpx.get(base, headers=headers, timeout=10)
            if r.status_code != 200:
                return _fail(r.json()["error"]["message"])
            for p in r.json()["pops"]:
                models = ", ".join(p["models"]) or "none"
                print(f"{p['code']} {'up  ' if p['up'] else 'DOWN'} {p['city']}: {models}")
            return 0
        if not args.code:
            return _fail(f"edge pop {args.action} needs a PoP code, e.g. edge pop {args.action} ICN")
        r = httpx.post(f"{base}/{args.code}/{args.action}", headers=headers, timeout=30)
    except httpx.HTTPError as exc:
        return _fail(f"cannot reach edge dev at {args.url} ({exc}); is it running?")
    if r.status_code != 200:
        return _fail(r.json()["error"]["message"])
    body = r.json()
    print(
        f"{body['code']} is {'up' if body['up'] else 'down'}"
        + (f"; {body['rerouted']} queued request(s) re-routed" if body["rerouted"] else "")
    )
    return 0


def add_client_parsers(sub) -> None:
    """edge deploy, versions, deployments, rollback, tail, secret and ai run."""

    def client_args(p):
        p.add_argument("--config", default=None, help=CONFIG_HELP)
        p.add_argument("--url", default="http://127.0.0.1:8787", help="the running runtime")

    dep = sub.add_parser("deploy", help="upload the worker (and its local modules) as a new version")
    client_args(dep)
    dep.add_argument("--message", "-m", help="a note kept with the version")
    dep.set_defaults(func=cmd_deploy)
    ver = sub.add_parser("versions", help="list versions, or deploy a split: edge versions deploy A@90 B@10")
    ver.add_argument("action", choices=["list", "deploy"], help="list versions, or deploy a split of them")
    ver.add_argument("splits", nargs="*", help="deploy: VERSION_ID@PERCENT ...")
    ver.add_argument("--name", help="the worker (default: the config's)")
    ver.add_argument("--message", "-m", help="deploy: a note kept with the deployment")
    client_args(ver)
    ver.set_defaults(func=cmd_versions)
    dl = sub.add_parser("deployments", help="list deployments, newest first")
    dl.add_argument("action", choices=["list"], nargs="?", default="list", help="list (the only action)")
    dl.add_argument("--name", help="the worker (default: the config's)")
    client_args(dl)
    dl.set_defaults(func=cmd_deployments)
    rb = sub.add_parser("rollback", help="deploy an earlier version (default: the one before the current)")
    rb.add_argument(
        "version_id", nargs="?", help="the version to deploy (default: the one before the current)"
    )
    rb.add_argument("--name", help="the worker (default: the config's)")
    rb.add_argument("--message", "-m", help="a note kept with the deployment")
    client_args(rb)
    rb.set_defaults(func=cmd_rollback)
    tail = sub.add_parser("tail", help="stream live events of a worker")
    tail.add_argument("worker", nargs="?", help="the worker (default: the config's)")
    tail.add_argument(
        "--format",
        choices=["json", "pretty"],
        default="pretty",
        help="json: one event per line, as Cloudflare's",
    )
    tail.add_argument(
        "--status", choices=["ok", "error"], help="only events with this outcome (default: all)"
    )
    client_args(tail)
    tail.set_defaults(func=cmd_tail)
    sec = sub.add_parser("secret", help="edge secret put NAME (value from stdin) | list | delete NAME")
    sec.add_argument(
        "action", choices=["put", "list", "delete"], help="put (value from stdin), list or delete"
    )
    sec.add_argument("secret", nargs="?", help="put/delete: the secret's name")
    sec.add_argument("--name", help="the worker (default: the config's)")
    client_args(sec)
    sec.set_defaults(func=cmd_secret)
    ai = sub.add_parser("ai", help="edge ai run MODEL PROMPT: call a model through the runtime's AI API")
    ai_sub = ai.add_subparsers(dest="ai_command", required=True)
    air = ai_sub.add_parser("run", help="run a model on a prompt")
    air.add_argument(
        "model", help="a model name, e.g. @edge/moonshotai/kimi-k2-mini or @cf/moonshotai/kimi-k2.6"
    )
    air.add_argument("prompt", help="the prompt")
    air.add_argument("--max-tokens", type=int, default=128, help="most tokens to generate")
    air.add_argument("--temperature", type=float, default=0.6, help="sampling temperature (0: greedy)")
    air.add_argument("--stream", action="store_true", help="print the answer as it is generated")
    client_args(air)
    air.set_defaults(func=cmd_ai_run)
    add_workflow_parsers(sub, client_args)
    add_gateway_parsers(sub, client_args)


def add_reload_parser(models) -> None:
    """edge models reload (under the `models` group the model tools fill)."""
    mrel = models.add_parser("reload", help="have a running edge dev's PoPs load a model's new version")
    mrel.add_argument("model", help="a catalog name")
    mrel.add_argument(
        "--config", default=None, help="its .edge/admin-token is sent (default: as edge dev finds it)"
    )
    mrel.add_argument("--url", default="http://127.0.0.1:8787", help="the running edge dev")
    mrel.set_defaults(func=cmd_models_reload)
