"""`edge workflows list | describe NAME ID | trigger NAME [--params JSON] [--id ID]`, as wrangler's
`workflows list`, `workflows instances describe` and `workflows trigger`, over the running
runtime's API (runtime.routes.workflows) with the account's API token."""

from __future__ import annotations

import argparse
import json

from runtime.cli.client import Client
from runtime.cli.common import _fail
from runtime.control.config import ConfigError


def cmd_workflows(args: argparse.Namespace) -> int:
    try:
        client = Client(args)
        if args.action == "list":
            for w in client.call("GET", "/workflows"):
                counts = ", ".join(f"{k} {v}" for k, v in sorted(w["instances"].items())) or "no instances"
                print(f"{w['name']}  ({w['class_name'] or 'not served here'})  {counts}")
            return 0
        if not args.workflow:
            return _fail(f"edge workflows {args.action} needs the workflow's name")
        if args.action == "describe":
            if not args.instance:
                return _fail("edge workflows describe NAME ID: give the instance id")
            print(
                json.dumps(
                    client.call("GET", f"/workflows/{args.workflow}/instances/{args.instance}"), indent=2
                )
            )
            return 0
        try:
            params = json.loads(args.params) if args.params is not None else None
        except ValueError as exc:
            return _fail(f"--params: not JSON ({exc})")
        body = {"params": params} | ({"instance_id": args.id} if args.id else {})
        made = client.call("POST", f"/workflows/{args.workflow}/instances", json=body)
        print(f"queued instance {made['id']} of workflow {args.workflow}")
    except ConfigError as exc:
        return _fail(str(exc))
    return 0


def add_workflow_parsers(sub, client_args) -> None:
    wf = sub.add_parser("workflows", help="list workflows, describe an instance, or trigger one")
    wf.add_argument("action", choices=["list", "describe", "trigger"], help="what to do")
    wf.add_argument("workflow", nargs="?", help="describe/trigger: the workflow's name")
    wf.add_argument("instance", nargs="?", help="describe: the instance id")
    wf.add_argument("--params", help="trigger: the instance's params, as JSON")
    wf.add_argument("--id", help="trigger: the instance id (default: a generated one)")
    client_args(wf)
    wf.set_defaults(func=cmd_workflows)
