"""The `edge` command line: main assembles the parser from each area's commands.

common: what every command shares; client: tokens and the HTTP client; control: the commands that
talk to a running runtime; accounts: its accounts and their tokens (admin); servers: edge dev and
edge pop serve; bench: edge bench serve (a load generator); models: the model tools; project:
edge init and edge d1 execute; vectorize: edge vectorize. edge sim / edge plan are capacity/cli.py's."""

from __future__ import annotations

import argparse

from capacity import cli as capacity_cli
from runtime.cli.accounts import add_account_parsers
from runtime.cli.ai_search import add_ai_search_parser
from runtime.cli.bench import add_bench_parser
from runtime.cli.common import _show_defaults
from runtime.cli.control import _pretty, add_client_parsers, add_reload_parser
from runtime.cli.models import add_model_parsers
from runtime.cli.project import add_d1_parser, add_init_parser
from runtime.cli.rollout import add_rollout_parser
from runtime.cli.servers import add_dev_parser, add_pop_parser, build_edge, load_topology
from runtime.cli.vectorize import add_vectorize_parser

__all__ = ["main", "build_edge", "load_topology", "_pretty"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge", description="Run AI workers on a simulated edge network.")
    sub = parser.add_subparsers(dest="command", required=True)
    add_dev_parser(sub)
    add_init_parser(sub)
    add_pop_parser(sub)
    add_client_parsers(sub)
    add_account_parsers(sub)
    models = sub.add_parser("models", help="inspect, compress and list models").add_subparsers(
        dest="models_command", required=True
    )
    add_model_parsers(models)
    add_reload_parser(models)
    add_rollout_parser(models)
    add_d1_parser(sub)
    add_vectorize_parser(sub)
    add_ai_search_parser(sub)
    add_bench_parser(sub)
    capacity_cli.register(sub)
    _show_defaults(parser)
    args = parser.parse_args(argv)
    return args.func(args)
