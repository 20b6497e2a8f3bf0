"""Project tools: edge init (a new worker project) and edge d1 execute (SQL on a local D1)."""

from __future__ import annotations

import argparse
from pathlib import Path

from runtime.cli.common import CONFIG_HELP, _fail
from runtime.control.config import ConfigError, load_config


def cmd_init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from runtime.cli.templates import InitError, write_project

    try:
        files = write_project(Path(args.name), args.template)
    except (InitError, OSError) as exc:
        return _fail(str(exc))
    # each file as a path under the folder (tests/test_worker.py, not test_worker.py): where it is
    shown = ", ".join(f.relative_to(Path(args.name)).as_posix() for f in files)
    print(f"created {args.name}/ ({args.template}): {shown}")
    print(f"next: cd {args.name} && edge dev")
    return 0


def cmd_d1_execute(args: argparse.Namespace) -> int:
    """SQL against a local D1 database, straight on its file under the state dir (no server needed;
    a running edge dev sees the change at once). A --file runs as one transaction."""
    import json

    from runtime.bindings import BindingError, binding_refs
    from runtime.bindings.d1 import D1Store
    from runtime.control.state import private_dir

    try:
        c = load_config(args.config)
    except ConfigError as exc:
        return _fail(str(exc))
    databases = c.bindings["d1_databases"]
    db = next((d for d in databases if args.database in (d.binding, d.database_name, d.database_id)), None)
    if db is None:
        known = ", ".join(d.database_name for d in databases) or "none"
        return _fail(f"no D1 database {args.database!r} in the config (d1_databases: {known})")
    if args.file:
        try:
            sql = Path(args.file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            return _fail(f"--file: {exc}")
    else:
        sql = args.command
    private_dir(c.state_dir)
    store = D1Store(c.state_dir / "d1")
    try:
        ident = binding_refs({"d1_databases": [db]})[db.binding].id
        results = store.database(c.account_id, ident).script(sql, atomic=bool(args.file))
    except BindingError as exc:
        return _fail(f"{exc}{'; nothing in the file was applied' if args.file else ''}")
    except ValueError as exc:
        return _fail(str(exc))
    finally:
        store.close()
    if args.json:
        out = [
            {
                "results": [dict(zip(r["columns"], row, strict=True)) for row in r["rows"]],
                "success": True,
                "meta": r["meta"],
            }
            for r in results
        ]
        print(json.dumps(out, indent=2, default=lambda b: b.hex()))
        return 0
    for r in results:
        if r["columns"]:
            print(_table(r["columns"], r["rows"]))
    changes = sum(r["meta"]["changes"] for r in results)
    print(f"{len(results)} statement(s) executed on {db.database_name} ({changes} row(s) changed)")
    return 0


def _table(columns: list[str], rows: list[list]) -> str:
    cells = [
        [("NULL" if v is None else v.hex() if isinstance(v, bytes) else str(v)) for v in row] for row in rows
    ]
    widths = [max([len(c), *(len(row[i]) for row in cells)]) for i, c in enumerate(columns)]
    line = "+" + "+".join("-" * (w + 2) for w in widths) + "+"
    fmt = "| " + " | ".join(f"{{:<{w}}}" for w in widths) + " |"
    return "\n".join([line, fmt.format(*columns), line, *(fmt.format(*row) for row in cells), line])


def add_init_parser(sub) -> None:
    from runtime.cli.templates import TEMPLATES

    init = sub.add_parser("init", help="create a new worker project that edge dev serves at once")
    init.add_argument("name", help="the folder to create (its name becomes the worker's)")
    init.add_argument(
        "--template",
        choices=list(TEMPLATES),
        default="hello",
        help="; ".join(f"{n}: {t.description}" for n, t in TEMPLATES.items()),
    )
    init.set_defaults(func=cmd_init)


def add_d1_parser(sub) -> None:
    d1 = sub.add_parser(
        "d1", help="edge d1 execute NAME --file F | --command SQL: run SQL on a local D1 database"
    )
    d1_sub = d1.add_subparsers(dest="d1_command", required=True)
    d1x = d1_sub.add_parser("execute", help="run SQL on the database's file under .edge/ (no server needed)")
    d1x.add_argument("database", help="its binding, database_name or database_id in the config")
    what = d1x.add_mutually_exclusive_group(required=True)
    what.add_argument("--file", help="a .sql file (run as one transaction)")
    what.add_argument("--command", help="SQL to run")
    d1x.add_argument("--config", default=None, help=CONFIG_HELP)
    d1x.add_argument("--json", action="store_true", help="print results as JSON")
    d1x.add_argument("--local", action="store_true", help="accepted for wrangler's sake: it is always local")
    d1x.set_defaults(func=cmd_d1_execute)
