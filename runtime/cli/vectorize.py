"""`edge vectorize create NAME --dimensions D --metric cosine|euclidean|dot-product`, `list`,
`info NAME`, `delete NAME`: the project's Vectorize indexes, as wrangler's commands name them,
worked straight on the state dir's file (no server needed; a running edge dev sees the change at
its next call), under the config's account."""

from __future__ import annotations

import argparse
import json

from runtime.cli.common import CONFIG_HELP, _fail
from runtime.control.config import ConfigError, load_config


def cmd_vectorize(args: argparse.Namespace) -> int:
    from runtime.bindings import BindingError
    from runtime.bindings.vectorize import VectorizeStore, store_path
    from runtime.control.state import private_dir

    try:
        c = load_config(args.config)
    except ConfigError as exc:
        return _fail(str(exc))
    private_dir(c.state_dir)
    store = VectorizeStore(store_path(c.state_dir))
    try:
        if args.vectorize_command == "create":
            out = store.create(c.account_id, args.name, args.dimensions, args.metric, args.description or "")
            done = f"created index {args.name} ({args.dimensions} dimensions, {args.metric})"
        elif args.vectorize_command == "list":
            out = store.indexes(c.account_id)
            done = (
                "\n".join(
                    f"{i['name']}: {i['config']['dimensions']} dimensions, {i['config']['metric']}, "
                    f"{i['vectorCount']} vectors"
                    for i in out
                )
                or "no Vectorize indexes (edge vectorize create NAME --dimensions D --metric cosine)"
            )
        elif args.vectorize_command == "info":
            out = store.info(c.account_id, args.name)
            done = json.dumps(out, indent=2)
        else:
            store.delete(c.account_id, args.name)
            out, done = {"deleted": args.name}, f"deleted index {args.name} and its vectors"
    except BindingError as exc:
        return _fail(str(exc))
    finally:
        store.close()
    print(json.dumps(out, indent=2) if args.json else done)
    return 0


def add_vectorize_parser(sub) -> None:
    from runtime.bindings.vector_search import METRICS

    vec = sub.add_parser("vectorize", help="create, list, inspect and delete local Vectorize indexes")
    vec_sub = vec.add_subparsers(dest="vectorize_command", required=True)
    create = vec_sub.add_parser("create", help="a new index (wrangler vectorize create)")
    create.add_argument("name", help="lowercase letters, digits and dashes, starting with a letter")
    shape = create.add_mutually_exclusive_group(required=True)
    shape.add_argument("--dimensions", type=int, help="the width of the vectors (1 to 1536)")
    shape.add_argument(
        "--preset", help="an embedding model's name: its width, cosine (@cf/baai/bge-base-en-v1.5)"
    )
    create.add_argument("--metric", choices=METRICS, default=None, help="cosine, euclidean or dot-product")
    create.add_argument("--description", default=None, help="a note kept with the index")
    for name, helptext in (("list", "the account's indexes"), ("info", "one index"), ("delete", "an index")):
        p = vec_sub.add_parser(name, help=helptext)
        if name != "list":
            p.add_argument("name", help="the index name")
        if name == "delete":
            p.add_argument("--force", "-y", action="store_true", help="accepted for wrangler's sake")
    for p in (create, *(vec_sub.choices[n] for n in ("list", "info", "delete"))):
        p.add_argument("--config", default=None, help=CONFIG_HELP)
        p.add_argument("--json", action="store_true", help="print JSON")
    vec.set_defaults(func=_with_preset)


def _with_preset(args: argparse.Namespace) -> int:
    if getattr(args, "preset", None):
        from runtime.ai.cloudflare_names import EMBEDDING_MODELS

        if args.preset not in EMBEDDING_MODELS:
            return _fail(
                f"--preset {args.preset}: not an embedding model; one of {', '.join(EMBEDDING_MODELS)}"
            )
        args.dimensions, args.metric = EMBEDDING_MODELS[args.preset], args.metric or "cosine"
    if args.vectorize_command == "create" and args.metric is None:
        return _fail("edge vectorize create needs --metric cosine|euclidean|dot-product (or --preset MODEL)")
    return cmd_vectorize(args)
