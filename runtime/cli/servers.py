"""The servers: `edge dev` (the runtime, with the simulated edge build_edge makes) and
`edge pop serve` (one GPU PoP node)."""

from __future__ import annotations

import argparse
import logging
import sys
import tomllib
from pathlib import Path

import msgspec

from edge_sim.topology import PoP, Topology, TopologyError
from runtime.cli.client import bootstrap_token
from runtime.cli.common import CONFIG_HELP, _fail
from runtime.cli.control import cmd_pop
from runtime.cli.ports import port_problem
from runtime.control.addresses import listen_origin
from runtime.control.config import ConfigError, WorkerConfig, load_config
from runtime.control.validation import describe

SHUTDOWN_GRACE_S = 3.0  # edge dev after SIGTERM / Ctrl-C: open responses get this long, then are cancelled


class TopologyFile(msgspec.Struct):
    pop: list[PoP]
    replace: bool = False


def load_topology(config: WorkerConfig) -> Topology:
    """The built-in world topology, extended or replaced by [edge] topology (a TOML file)."""
    if not config.edge.topology:
        return Topology.default()
    path = Path(config.base_dir) / config.edge.topology
    try:
        spec = msgspec.convert(tomllib.loads(path.read_text()), TopologyFile)
    except FileNotFoundError:
        raise ConfigError(f"edge.topology: {path} does not exist") from None
    except (tomllib.TOMLDecodeError, msgspec.ValidationError) as exc:
        message = describe(exc) if isinstance(exc, msgspec.ValidationError) else str(exc)
        raise ConfigError(f"{path}: {message}") from None
    try:
        return Topology(spec.pop) if spec.replace else Topology.default().with_overrides(extra=spec.pop)
    except TopologyError as exc:
        raise ConfigError(f"{path}: {exc}") from None


def build_edge(config: WorkerConfig):
    """The simulated edge for `config`: topology, RTT model, and in-process GPU PoPs with engines.

    Engines load only at the GPU PoPs the config serves from (config.gpu_pops): a worker without an
    AI binding and without `[edge] pops` gets none, and `pops = []` is an edge with no GPU PoP (AI
    calls then fail with 3040); neither needs a model catalog."""
    from edge_sim.edge import Edge
    from edge_sim.network import NetworkModel
    from edge_sim.topology import TopologyError
    from runtime.ai.catalog import catalog_if_any, model_spec, served_models
    from runtime.control.config import check_against_topology

    pops = config.gpu_pops
    catalog, names = served_models(config) if pops else (catalog_if_any(config), [])
    specs = [model_spec(config, n, catalog) for n in names]
    try:
        topology = load_topology(config)
        check_against_topology(config, topology)  # edge.client_location, before any engine loads
        for code in pops:
            if not topology.pop(code).has_gpu:
                gpu_codes = ", ".join(p.code for p in topology.gpu_pops())
                raise ConfigError(f"edge.pops: {code} has no GPUs in the topology; GPU PoPs: {gpu_codes}")
        topology = topology.with_overrides(gpu_pops={c: topology.pop(c).gpus for c in pops})
        network = NetworkModel(
            **{f: getattr(config.edge.network, f) for f in config.edge.network.__struct_fields__}
        )
        edge = Edge.start(topology, network, pops, specs)
        edge.targets = {n: catalog[n][0].target for n in names if catalog[n][0].target is not None}
        for node in edge.nodes.values():
            node.max_in_flight = config.edge.max_in_flight
        return edge
    except (TopologyError, ValueError) as exc:
        raise ConfigError(f"[edge]: {exc}") from None


def cmd_dev(args: argparse.Namespace) -> int:
    # a port another process holds, first, in a second: before the runtime's imports (torch) and
    # the models' load
    if problem := port_problem(args.host, args.port, busy_only=True):
        return _fail(problem)
    import uvicorn

    from runtime.app import Runtime, create_app
    from runtime.host.sockets import WIRE_BYTES, WIRE_QUEUE

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(name)s: %(message)s"
    )
    from runtime.isolate import console as isolate_console
    from runtime.isolate import process as isolate

    isolate_console.install()  # workers' console lines bare in the terminal: `[worker] text`

    if args.insecure_isolation:
        isolate.use_insecure_isolation()
        print(
            "edge dev: WARNING --insecure-isolation: workers run without namespaces, as this user, "
            "seeing its processes and network; use it only for scripts you trust",
            file=sys.stderr,
            flush=True,
        )
    elif problem := isolate.isolation_problem():
        return _fail(problem)
    try:
        config = load_config(args.config)
        edge = build_edge(config)
        edge.emulate = args.network == "emulate"
    except ConfigError as exc:
        return _fail(str(exc))
    except Exception as exc:  # a model that fails to load, say: print why, not a traceback
        return _fail(f"{type(exc).__name__}: {exc}")
    isolate_console.configure(config.observability)
    from runtime.ai.catalog import catalog_if_any
    from runtime.control.admin import ADMIN_TOKEN_ENV, bootstrap_admin_token
    from runtime.control.state import State
    from runtime.host.deps import DependencyError, install

    try:  # the project's pyproject.toml / requirements.txt, installed under .edge/python/ once
        deps = install(Path(config.base_dir), config.state_dir, log=lambda m: print(m, flush=True))
    except (DependencyError, OSError) as exc:
        return _fail(str(exc))
    state = State(config.state_dir / "state.db")
    token, created = bootstrap_token(config, state)
    admin_token, admin_created = bootstrap_admin_token(config.state_dir)
    runtime = Runtime(
        config,
        edge,
        state,
        catalog_if_any(config),
        deps=deps,
        admin_token=admin_token,
        watch=args.reload,
        origin=listen_origin(args.host, args.port),
    )
    print(f"edge dev: worker {config.name!r} ({config.main}) on http://{args.host}:{args.port}", flush=True)
    if runtime.origin != listen_origin(args.host, args.port):
        print(f"  public URL ([edge] public_url): {runtime.origin}", flush=True)
    print(
        f"  dashboard: http://{args.host}:{args.port}/cdn-cgi/edge/dashboard (sign in with the admin token)",
        flush=True,
    )
    if deps:
        print(f"  its dependencies: {deps} (read-only at /edge/deps in its isolate)", flush=True)
    if created:  # shown once; kept (only) in .edge/api-token for the CLI
        print(
            f"  API token for account {config.account_id!r} (saved in .edge/api-token): {token}", flush=True
        )
    if admin_created:  # shown once; kept (only) in .edge/admin-token for the CLI's control commands
        print(
            f"  admin token for /cdn-cgi/edge/ control (saved in .edge/admin-token, "
            f"or set {ADMIN_TOKEN_ENV}): {admin_token}",
            flush=True,
        )
    for node in edge.nodes.values():
        where = f" at {node.pop.url} (its models once its first health check answers)" if node.pop.url else ""
        print(
            f"  GPU PoP {node.code} ({node.pop.city}){where}: {', '.join(sorted(node.models()))}", flush=True
        )
    if not edge.nodes:
        why = "[edge] pops is empty" if config.edge.pops is not None else "the worker has no AI binding"
        print(f"  no GPU PoP, no engine loaded: {why}", flush=True)
    print(
        f"  default client location: {config.edge.client_location} "
        f"(override per request with the x-edge-client-location header)",
        flush=True,
    )
    if note := isolate_console.settings.describe():
        print(f"  {note}", flush=True)
    server = uvicorn.Server(
        uvicorn.Config(
            create_app(runtime),
            host=args.host,
            port=args.port,
            log_level=args.log_level,
            ws_max_size=WIRE_BYTES,  # a frame over it is closed 1009 by the protocol; over 1 MiB by ours
            ws_max_queue=WIRE_QUEUE,  # frames buffered before uvicorn stops reading a client
            # after a signal, responses still open this long are cancelled: a stop takes seconds
            timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )
    )
    on_signal = server.handle_exit

    def handle_exit(sig, frame) -> None:
        # uvicorn waits for every open response before it stops: end the dashboards' endless streams
        runtime.closing()
        on_signal(sig, frame)

    server.handle_exit = handle_exit  # type: ignore[method-assign]
    try:
        server.run()
    except SystemExit as exc:  # uvicorn did not start (and stopped the runtime): the port, say,
        if exc.code in (0, None):  # taken since the check; one line and exit 2, not a crash
            raise
        return _fail(
            port_problem(args.host, args.port) or "the server did not start (uvicorn's reason above)"
        )
    return 0


def cmd_pop_serve(args: argparse.Namespace) -> int:
    """Run one GPU PoP node as its own server (msgspec over HTTP) for an edge elsewhere. It needs
    a node token (--token or $EDGE_NODE_TOKEN), the one the runtime sends, and refuses to start
    without one: a token made up here would change at every restart and lock the runtime out."""
    import os

    import uvicorn

    from edge_sim.pop import PopNode
    from edge_sim.remote import NODE_TOKEN_ENV, create_pop_app
    from runtime.ai.catalog import model_spec, served_models

    node_token = (args.token or os.environ.get(NODE_TOKEN_ENV, "")).strip()
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(name)s: %(message)s"
    )
    try:
        config = load_config(args.config)
        topology = load_topology(config)
        if not args.name:
            codes = ", ".join(p.code for p in topology.gpu_pops())
            raise ConfigError(f"edge pop serve needs --name CODE: the GPU PoP this node is (one of {codes})")
        pop = topology.pop(args.name)
        catalog, names = served_models(config)
        if not node_token:  # checked once the config is known good, before any model loads
            raise ConfigError(
                f"edge pop serve needs a node token: set {NODE_TOKEN_ENV} (or pass --token) here and the "
                f"same {NODE_TOKEN_ENV} (or {NODE_TOKEN_ENV}_<CODE>) for edge dev; make one with "
                '`python -c "import secrets; print(secrets.token_urlsafe(32))"`'
            )
        if problem := port_problem(args.host, args.port, busy_only=True):  # before the models load
            return _fail(problem)
        node = PopNode.load(pop, [model_spec(config, n, catalog) for n in names])
    except (ConfigError, TopologyError) as exc:
        return _fail(str(exc))
    node.max_in_flight = config.edge.max_in_flight
    print(
        f"edge pop serve: {pop.code} ({pop.city}) on http://{args.host}:{args.port}: "
        f"{', '.join(node.models()) or 'no models'}",
        flush=True,
    )
    for name, reason in node.refused.items():
        print(f"  refused {name}: {reason}", flush=True)
    uvicorn.run(create_pop_app(node, node_token), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def add_dev_parser(sub) -> None:
    dev = sub.add_parser("dev", help="serve the worker locally, with the model running on simulated GPU PoPs")
    dev.add_argument("--config", default=None, help=CONFIG_HELP)
    dev.add_argument("--host", default="127.0.0.1", help="address to listen on")
    dev.add_argument("--port", type=int, default=8787, help="port to listen on")
    dev.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the runtime's log level, and the lowest level of the workers' console lines shown "
        "(print is info, print(file=sys.stderr) error, logging its own)",
    )
    dev.add_argument(
        "--no-reload",
        dest="reload",
        action="store_false",
        help="do not restart the worker when its source changes",
    )
    dev.add_argument(
        "--network",
        choices=["account", "emulate"],
        default="account",
        help="account: simulated network delays are only reported; emulate: they are waited",
    )
    dev.add_argument(
        "--insecure-isolation",
        action="store_true",
        help="run workers without namespaces (for kernels that refuse user namespaces); unsafe",
    )
    dev.set_defaults(func=cmd_dev)


def add_pop_parser(sub) -> None:
    """edge pop: serve runs a node here; down, up and list go to a running edge dev (control)."""
    pop = sub.add_parser("pop", help="serve a PoP node, or take a running edge dev's PoP down or up, or list")
    pop.add_argument(
        "action",
        choices=["down", "up", "list", "serve"],
        help="take a PoP down or up, list them, or serve a node",
    )
    pop.add_argument("code", nargs="?", help="down/up: the PoP's code (e.g. ICN)")
    pop.add_argument("--url", default="http://127.0.0.1:8787", help="the running edge dev")
    pop.add_argument("--name", help="serve: the PoP code this node is (e.g. ICN)")
    pop.add_argument("--host", default="127.0.0.1", help="serve: address to listen on")
    pop.add_argument("--port", type=int, default=9000, help="serve: port to listen on")
    pop.add_argument(
        "--config",
        default=None,
        help="serve: the config whose catalog and trust to use; down/up/list: its .edge/admin-token is sent",
    )
    pop.add_argument(
        "--token", help="serve: the node token the runtime must send (default: $EDGE_NODE_TOKEN)"
    )
    pop.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="serve: the node's log level",
    )
    pop.set_defaults(func=lambda a: cmd_pop_serve(a) if a.action == "serve" else cmd_pop(a))
