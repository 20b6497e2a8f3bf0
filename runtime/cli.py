"""The `edge` command line."""

from __future__ import annotations

import argparse
import logging
import sys
import tomllib
from pathlib import Path

import msgspec

from capacity import cli as capacity_cli
from edge_sim.topology import PoP, Topology, TopologyError
from runtime.config import CONFIG_NAMES, ConfigError, WorkerConfig, load_config
from runtime.validation import describe

# --config's default (None): the first of these in the current folder, as wrangler looks for its own
CONFIG_HELP = f"path to the config (default: the first of {', '.join(CONFIG_NAMES)} in this folder)"


def _fail(message: str) -> int:
    print(f"edge: error: {message}", file=sys.stderr)
    return 2


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
    from runtime.catalog import catalog_if_any, model_spec, served_models
    from runtime.config import check_against_topology

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


TOKEN_ENV = "EDGE_API_TOKEN"


def bootstrap_token(config: WorkerConfig, state) -> tuple[str, bool]:
    """The dev account's API token: $EDGE_API_TOKEN, else the one saved at first start, else a
    new one (saved under .edge/, which is never committed). Returns (token, newly created)."""
    import os

    state.ensure_account(config.account_id)
    path = config.state_dir / "api-token"
    env = os.environ.get(TOKEN_ENV)
    if env:
        state.add_token(config.account_id, env)
        return env, False
    if path.is_file() and state.account_for(path.read_text().strip()) == config.account_id:
        return path.read_text().strip(), False
    token = state.create_token(config.account_id, "edge dev")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(token + "\n")
    path.chmod(0o600)
    return token, True


def admin_headers(config_path: str | None) -> dict[str, str]:
    """The admin token for the control endpoints: $EDGE_ADMIN_TOKEN, else the config's
    .edge/admin-token (edge dev writes it at first start). Raises ConfigError when neither exists."""
    from runtime.admin import ADMIN_TOKEN_ENV, find_admin_token

    token = find_admin_token(None)  # the environment's, if any
    path = None
    if not token:
        try:
            state_dir = load_config(config_path).state_dir
        except ConfigError as exc:
            raise ConfigError(f"no admin token: set {ADMIN_TOKEN_ENV}, or pass --config ({exc})") from None
        path = state_dir / "admin-token"
        token = find_admin_token(state_dir)
    if not token:
        raise ConfigError(
            f"no admin token: set {ADMIN_TOKEN_ENV}, or run `edge dev` once (it saves one in {path})"
        )
    return {"authorization": f"Bearer {token}"}


class Client:
    """The CLI's side of the runtime's HTTP APIs (token from $EDGE_API_TOKEN or .edge/api-token)."""

    def __init__(self, args: argparse.Namespace):
        import os

        self.config = load_config(args.config)
        self.url = args.url.rstrip("/")
        token = os.environ.get(TOKEN_ENV)
        path = self.config.state_dir / "api-token"
        if not token and path.is_file():
            token = path.read_text().strip()
        if not token:
            raise ConfigError(
                f"no API token: set {TOKEN_ENV}, or run `edge dev` once (it saves one in {path})"
            )
        self.headers = {"authorization": f"Bearer {token}"}
        self.account = self.config.account_id

    def call(self, method: str, path: str, **kw):
        import httpx

        try:
            r = httpx.request(
                method,
                f"{self.url}/client/v4/accounts/{self.account}{path}",
                headers=self.headers,
                timeout=kw.pop("timeout", 120),
                **kw,
            )
        except httpx.HTTPError as exc:
            raise ConfigError(
                f"cannot reach the runtime at {self.url} ({exc}); is edge dev running?"
            ) from None
        body = r.json()
        if not body.get("success", True):
            raise ConfigError("; ".join(f"{e['code']}: {e['message']}" for e in body["errors"]))
        return body.get("result", body)


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
        if c.queues.producers or c.queues.consumers:  # the upload has no place for them yet
            print(
                "edge: warning: queues are not deployed: a deployed version has no queue bindings and "
                "consumes no queue; they run only for the worker `edge dev` serves",
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
                "kv_namespaces": [{"binding": k.binding, "id": k.id} for k in c.kv_namespaces],
                "d1_databases": [
                    {"binding": d.binding, "database_name": d.database_name, "database_id": d.database_id}
                    for d in c.d1_databases
                ],
                "r2_buckets": [{"binding": r.binding, "bucket_name": r.bucket_name} for r in c.r2_buckets],
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


def cmd_d1_execute(args: argparse.Namespace) -> int:
    """SQL against a local D1 database, straight on its file under the state dir (no server needed;
    a running edge dev sees the change at once). A --file runs as one transaction."""
    import json

    from runtime.bindings import BindingError, binding_refs
    from runtime.bindings.d1 import D1Store
    from runtime.state import private_dir

    try:
        c = load_config(args.config)
    except ConfigError as exc:
        return _fail(str(exc))
    db = next(
        (d for d in c.d1_databases if args.database in (d.binding, d.database_name, d.database_id)), None
    )
    if db is None:
        known = ", ".join(d.database_name for d in c.d1_databases) or "none"
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
        ident = binding_refs(d1=[db])[db.binding].id
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
    req = (event.get("event") or {}).get("request", {})
    status = (event.get("event") or {}).get("response", {}).get("status", "")
    lines = [
        # eventTimestamp is in milliseconds, as Cloudflare's tail has it
        f"[{_when(event.get('eventTimestamp', 0) / 1000)}] {event.get('outcome')} {req.get('method', '')} "
        f"{req.get('url', '')} {status}".rstrip()
    ]
    lines += [f"  ({log['level']}) {log['message']}" for log in event.get("logs", [])]
    for exc in event.get("exceptions", []):
        lines.append(f"  {exc.get('name')}: {exc.get('message')}")
        lines += [f"    {row}" for row in (exc.get("stack") or "").rstrip().splitlines()]
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


def cmd_dev(args: argparse.Namespace) -> int:
    import uvicorn

    from runtime.app import Runtime, create_app

    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()), format="%(levelname)s %(name)s: %(message)s"
    )
    from runtime import isolate

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
    from runtime.admin import ADMIN_TOKEN_ENV, bootstrap_admin_token
    from runtime.catalog import catalog_if_any
    from runtime.deps import DependencyError, install
    from runtime.state import State

    try:  # the project's pyproject.toml / requirements.txt, installed under .edge/python/ once
        deps = install(Path(config.base_dir), config.state_dir, log=lambda m: print(m, flush=True))
    except (DependencyError, OSError) as exc:
        return _fail(str(exc))
    state = State(config.state_dir / "state.db")
    token, created = bootstrap_token(config, state)
    admin_token, admin_created = bootstrap_admin_token(config.state_dir)
    runtime = Runtime(config, edge, state, catalog_if_any(config), deps=deps)
    runtime.admin_token = admin_token
    runtime.watch = args.reload
    print(f"edge dev: worker {config.name!r} ({config.main}) on http://{args.host}:{args.port}", flush=True)
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
        print(f"  GPU PoP {node.code} ({node.pop.city}): {', '.join(sorted(node.models()))}", flush=True)
    if not edge.nodes:
        why = "[edge] pops is empty" if config.edge.pops is not None else "the worker has no AI binding"
        print(f"  no GPU PoP, no engine loaded: {why}", flush=True)
    print(
        f"  default client location: {config.edge.client_location} "
        f"(override per request with the x-edge-client-location header)",
        flush=True,
    )
    uvicorn.run(create_app(runtime), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def cmd_models_info(args: argparse.Namespace) -> int:
    import msgspec

    from engine.checkpoint import checkpoint_info
    from engine.errors import ModelLoadError

    try:
        rows = checkpoint_info(args.dir, args.weights, args.parts)
    except ModelLoadError as exc:
        return _fail(str(exc))
    if args.json:
        print(msgspec.json.encode(rows).decode())
        return 0
    header = ["part", "tensors", "parameters", "bf16 MiB", "stored MiB", "stored as"]
    if args.weights:
        header += [f"{args.weights} MiB", "ratio"]
    lines = [header]
    totals = [0, 0, 0, 0, 0]
    for r in rows:
        line = [
            r.part,
            str(r.tensors),
            f"{r.parameters:,}",
            _mib(r.bf16_bytes),
            _mib(r.stored_bytes),
            r.stored_format,
        ]
        if args.weights:
            line += [_mib(r.target_bytes), f"{r.target_bytes / r.bf16_bytes:.3f}x"]
        lines.append(line)
        for i, v in enumerate((r.tensors, r.parameters, r.bf16_bytes, r.stored_bytes, r.target_bytes or 0)):
            totals[i] += v
    total = ["total", str(totals[0]), f"{totals[1]:,}", _mib(totals[2]), _mib(totals[3]), ""]
    if args.weights:
        total += [_mib(totals[4]), f"{totals[4] / totals[2]:.3f}x"]
    lines.append(total)
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    for line in lines:
        print(
            "  ".join(
                c.ljust(w) if i in (0, 5) else c.rjust(w)
                for i, (c, w) in enumerate(zip(line, widths, strict=True))
            )
        )
    return 0


def cmd_models_quantize(args: argparse.Namespace) -> int:
    from engine.checkpoint import quantize_checkpoint
    from engine.errors import ModelLoadError

    try:
        sizes = quantize_checkpoint(args.src, args.dst, args.weights, args.parts)
    except ModelLoadError as exc:
        return _fail(str(exc))
    before, after = sizes["bytes_before"], sizes["bytes_after"]
    print(f"wrote {args.dst}: {_mib(before)} MiB -> {_mib(after)} MiB of tensors ({after / before:.3f}x)")
    return 0


def cmd_models_eval(args: argparse.Namespace) -> int:
    import msgspec

    from engine.errors import EngineError
    from engine.quality import evaluate, format_table

    split = lambda text: [x.strip() for x in text.split(",") if x.strip()]  # noqa: E731
    try:
        contexts = [int(c) for c in split(args.contexts)]
    except ValueError:
        return _fail(f"--contexts {args.contexts!r}: give token counts such as 256,1024,2048")
    try:
        rows = evaluate(
            _model_dir(args.model, args.config),
            split(args.kv),
            contexts,
            weights=split(args.weights),
            text=args.text,
            max_windows=args.max_windows,
            trusted_keys=args.pubkey or None,
            allow_unsigned=args.allow_unsigned,
        )
    except (EngineError, ConfigError) as exc:
        return _fail(str(exc))
    if args.json:
        print(msgspec.json.encode(rows).decode())
    else:
        print(format_table(rows))
    if args.record:
        path = quality_record_path(_model_dir(args.model, args.config))
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(msgspec.json.format(msgspec.json.encode(rows), indent=2) + b"\n")
        print(f"recorded in {path}")
    return 0


def quality_record_path(model_dir):
    from runtime.catalog import quality_path

    return quality_path(model_dir)


def _model_dir(model: str, config_path: str | None):
    """A catalog name (with the config's models folder) or a model directory."""
    from pathlib import Path

    if Path(model).is_dir():
        return Path(model)
    from runtime.catalog import load_catalog

    catalog = load_catalog(load_config(config_path).models_dir)
    if model not in catalog:
        raise ConfigError(f"{model!r} is neither a model directory nor in the catalog ({', '.join(catalog)})")
    return catalog[model][1]


def cmd_models_keygen(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.integrity import keygen

    keyfile = Path(args.keyfile)
    if keyfile.exists() and not args.force:
        return _fail(f"{keyfile} exists; pass --force to replace it")
    pub = keygen(keyfile)
    print(f"wrote {keyfile} (private, keep it secret) and {pub} (public, give it to whoever verifies)")
    return 0


def cmd_models_sign(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.errors import ModelLoadError
    from engine.integrity import sign

    try:
        out = sign(Path(args.dir), Path(args.key), Path(args.source) if args.source else None)
    except ModelLoadError as exc:
        return _fail(str(exc))
    print(f"wrote {out}")
    return 0


def cmd_models_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.errors import ModelLoadError
    from engine.integrity import MANIFEST, load_public_key, verify
    from engine.verified_load import default_trusted_keys

    model_dir = Path(args.dir)
    try:
        keys = [load_public_key(Path(k)) for k in (args.pubkey or default_trusted_keys())]
    except ModelLoadError as exc:
        return _fail(str(exc))
    if not (model_dir / MANIFEST).is_file():
        return _fail(f"{model_dir}: no {MANIFEST}; sign it with `edge models sign {model_dir} --key KEY`")
    result = verify(model_dir, keys)
    if not result.ok:
        for problem in result.problems:
            print(f"FAIL {problem}", file=sys.stderr)
        return 1
    print(f"OK {model_dir}: {len(result.files)} files match, signed by key {result.signed_by[:16]}")
    return 0


def cmd_models_promote(args: argparse.Namespace) -> int:
    """Verify NEW, compare it with BASELINE on held-out text, and refuse it past the thresholds."""
    import json
    import time
    from pathlib import Path

    from engine import LLM
    from engine.errors import EngineError
    from engine.quality import compare, heldout_text_path

    try:
        limit = float(args.max_ppl_increase.rstrip("%"))
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        return _fail(
            "--max-ppl-increase takes a percentage such as 1% and --contexts token counts such as 256,1024"
        )
    new, old = Path(args.new), Path(args.baseline)
    keys = args.pubkey or None
    started = time.perf_counter()
    try:
        candidate = LLM(new, device="cpu", trusted_keys=keys)  # refuses anything that fails verification
        verification_s = time.perf_counter() - started
        baseline = LLM(old, device="cpu", trusted_keys=keys, allow_unsigned=args.allow_unsigned_baseline)
        text = Path(args.text) if args.text else heldout_text_path(old)
        started = time.perf_counter()
        rows = compare(candidate, baseline, contexts, text, args.max_windows)
        evaluation_s = time.perf_counter() - started
    except EngineError as exc:
        print(f"REFUSED {new}: {exc}", file=sys.stderr)
        return 1
    failures = [
        f"perplexity +{r.ppl_change_pct:.2f}% at {r.context} tokens exceeds +{limit}%"
        for r in rows
        if r.ppl_change_pct > limit
    ]
    failures += [
        f"greedy agreement {r.greedy_agreement:.1%} at {r.context} tokens is under {args.min_agreement:.0%}"
        for r in rows
        if r.greedy_agreement < args.min_agreement
    ]
    for r in rows:
        print(
            f"context {r.context:5d}: perplexity {r.baseline_perplexity:.3f} -> {r.candidate_perplexity:.3f} "
            f"({r.ppl_change_pct:+.2f}%), greedy agreement {r.greedy_agreement:.1%}"
        )
    print(
        f"verification {verification_s:.2f} s (signed by {candidate.verification.signed_by[:16]}), "
        f"evaluation {evaluation_s:.2f} s"
    )
    record = {
        "new": str(new),
        "baseline": str(old),
        "promoted": not failures,
        "reasons": failures,
        "signed_by": candidate.verification.signed_by,
        "verification_seconds": round(verification_s, 3),
        "evaluation_seconds": round(evaluation_s, 3),
        "rows": [msgspec_builtins(r) for r in rows],
        "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    log_path = Path(args.record) if args.record else new.parent / "promotions.jsonl"
    with open(log_path, "a") as f:
        f.write(json.dumps(record) + "\n")
    if failures:
        for reason in failures:
            print(f"REFUSED {new}: {reason}", file=sys.stderr)
        return 1
    print(f"PROMOTED {new} over {old} (recorded in {log_path})")
    return 0


def msgspec_builtins(obj):
    import msgspec

    return msgspec.to_builtins(obj)


def cmd_models_list(args: argparse.Namespace) -> int:
    """The catalog, with each model's formats, its verification and its last measured quality."""
    import json

    from engine.errors import ModelLoadError
    from engine.integrity import MANIFEST, load_public_key, verify
    from engine.verified_load import default_trusted_keys
    from runtime.catalog import load_catalog

    try:
        config = load_config(args.config)
        catalog = load_catalog(config.models_dir)
        keys = [load_public_key(Path(k)) for k in (config.trusted_keys or default_trusted_keys())]
    except (ConfigError, ModelLoadError) as exc:
        return _fail(str(exc))
    for name, (entry, folder) in catalog.items():
        print(f"{name}\n  {entry.task}; weights {entry.weights}, KV cache {entry.kv_cache_dtype}; {folder}")
        if entry.description:
            print(f"  {entry.description}")
        if not (folder / MANIFEST).is_file():
            state = "unsigned (served only if [models] allow_unsigned = true)"
        else:
            result = verify(folder, keys)
            state = (
                f"verified, signed by {result.signed_by[:16]}"
                if result.ok
                else "REFUSED: " + "; ".join(result.problems)
            )
        print(f"  integrity: {state}")
        record = quality_record_path(folder)
        if record.is_file():
            rows = [r for r in json.loads(record.read_text()) if r["kv_cache_dtype"] == entry.kv_cache_dtype]
            changes = ", ".join(f"{r['ppl_change_pct']:+.2f}% at {r['context']}" for r in rows)
            kv = entry.kv_cache_dtype
            print(f"  quality, KV {kv} vs uncompressed: perplexity {changes or 'not measured'}")
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


def cmd_pop_serve(args: argparse.Namespace) -> int:
    """Run one GPU PoP node as its own server (msgspec over HTTP) for an edge elsewhere. It needs
    a node token (--token or $EDGE_NODE_TOKEN), the one the runtime sends, and refuses to start
    without one: a token made up here would change at every restart and lock the runtime out."""
    import os

    import uvicorn

    from edge_sim.pop import PopNode
    from edge_sim.remote import NODE_TOKEN_ENV, create_pop_app
    from runtime.catalog import model_spec, served_models

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


def cmd_init(args: argparse.Namespace) -> int:
    from pathlib import Path

    from runtime.templates import InitError, write_project

    try:
        files = write_project(Path(args.name), args.template)
    except (InitError, OSError) as exc:
        return _fail(str(exc))
    print(f"created {args.name}/ ({args.template}): {', '.join(f.name for f in files)}")
    print(f"next: cd {args.name} && edge dev")
    return 0


class _DefaultsHelp(argparse.HelpFormatter):
    """Help that shows each option's default, where it has one worth showing and does not say it."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        if action.nargs == 0 or default in (None, argparse.SUPPRESS) or "default" in text:
            return text  # a flag, nothing to show, or the help already says it
        if not action.option_strings and action.nargs not in (argparse.OPTIONAL, argparse.ZERO_OR_MORE):
            return text
        return f"{text} (default: %(default)s)"


def _show_defaults(parser: argparse.ArgumentParser) -> None:
    """Every parser of the command tree formats its help with _DefaultsHelp."""
    parser.formatter_class = _DefaultsHelp
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for child in action.choices.values():
                _show_defaults(child)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="edge", description="Run AI workers on a simulated edge network.")
    sub = parser.add_subparsers(dest="command", required=True)
    dev = sub.add_parser("dev", help="serve the worker locally, with the model running on simulated GPU PoPs")
    dev.add_argument("--config", default=None, help=CONFIG_HELP)
    dev.add_argument("--host", default="127.0.0.1", help="address to listen on")
    dev.add_argument("--port", type=int, default=8787, help="port to listen on")
    dev.add_argument(
        "--log-level",
        default="info",
        choices=["debug", "info", "warning", "error"],
        help="the runtime's log level",
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
    from runtime.templates import TEMPLATES

    init = sub.add_parser("init", help="create a new worker project that edge dev serves at once")
    init.add_argument("name", help="the folder to create (its name becomes the worker's)")
    init.add_argument(
        "--template",
        choices=list(TEMPLATES),
        default="hello",
        help="; ".join(f"{n}: {t.description}" for n, t in TEMPLATES.items()),
    )
    init.set_defaults(func=cmd_init)

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

    models = sub.add_parser("models", help="inspect, compress and list models").add_subparsers(
        dest="models_command", required=True
    )
    info = models.add_parser("info", help="parameters and bytes per part, before and after compression")
    info.add_argument("dir", help="an HF-format model directory")
    info.add_argument("--weights", choices=["fp8", "int8", "int4"], help="also show the size in this format")
    info.add_argument("--parts", default=None, help="parts to compress (default: experts)")
    info.add_argument("--json", action="store_true", help="print JSON")
    info.set_defaults(func=cmd_models_info)
    quant = models.add_parser("quantize", help="write a compressed copy of a checkpoint")
    quant.add_argument("src", help="the HF-format checkpoint to compress")
    quant.add_argument("dst", help="the folder to write the compressed copy to")
    quant.add_argument("--weights", required=True, choices=["fp8", "int8", "int4"], help="the weight format")
    quant.add_argument(
        "--parts",
        default=None,
        help="comma-separated: experts (default), routed_experts, shared_experts, "
        "dense_mlp, attention, mlp, all",
    )
    quant.set_defaults(func=cmd_models_quantize)
    ev = models.add_parser("eval", help="perplexity and greedy agreement per KV / weight setting")
    ev.add_argument("model", help="a model directory or catalog name")
    ev.add_argument("--kv", default="auto,fp8,int8,int4", help="KV dtypes, comma-separated")
    ev.add_argument(
        "--weights", default="auto", help="weight formats, comma-separated (first is the baseline)"
    )
    ev.add_argument("--contexts", default="256,1024,2048", help="context lengths, comma-separated")
    ev.add_argument("--text", default=None, help="held-out text (default: the model's)")
    ev.add_argument("--max-windows", type=int, default=None, help="cap on windows per context")
    ev.add_argument("--config", default=None, help=CONFIG_HELP)
    ev.add_argument("--json", action="store_true", help="print JSON")
    ev.add_argument("--pubkey", action="append", help="trusted public key (repeatable; default: models/keys)")
    ev.add_argument("--allow-unsigned", action="store_true", help="evaluate a model without a manifest")
    ev.add_argument(
        "--record", action="store_true", help="keep the results for the catalog (models/quality/)"
    )
    ev.set_defaults(func=cmd_models_eval)
    kg = models.add_parser("keygen", help="make an Ed25519 key pair: KEYFILE (private) and KEYFILE.pub")
    kg.add_argument("keyfile", help="where to write the private key (the public key goes to KEYFILE.pub)")
    kg.add_argument("--force", action="store_true", help="overwrite an existing key")
    kg.set_defaults(func=cmd_models_keygen)
    sg = models.add_parser("sign", help="write a signed manifest (in-toto statement in a DSSE envelope)")
    sg.add_argument("dir", help="the model directory to sign")
    sg.add_argument("--key", required=True, help="Ed25519 private key (from edge models keygen)")
    sg.add_argument("--source", help="the checkpoint this one was compressed from (its manifest is linked)")
    sg.set_defaults(func=cmd_models_sign)
    vf = models.add_parser("verify", help="check files and signature against the manifest")
    vf.add_argument("dir", help="the model directory to verify")
    vf.add_argument("--pubkey", action="append", help="trusted public key (repeatable; default: models/keys)")
    vf.set_defaults(func=cmd_models_verify)
    pr = models.add_parser("promote", help="verify a new model and gate it on quality against a baseline")
    pr.add_argument("new", help="the new model directory")
    pr.add_argument("--baseline", required=True, help="the model directory it must match")
    pr.add_argument(
        "--max-ppl-increase", default="1%", help="largest perplexity increase allowed, in percent"
    )
    pr.add_argument("--min-agreement", type=float, default=0.0, help="minimum greedy agreement, 0-1")
    pr.add_argument("--contexts", default="256,1024", help="context lengths, comma-separated")
    pr.add_argument("--max-windows", type=int, default=None, help="cap on windows per context")
    pr.add_argument("--text", default=None, help="held-out text (default: the baseline's)")
    pr.add_argument("--pubkey", action="append", help="trusted public key (repeatable; default: models/keys)")
    pr.add_argument(
        "--allow-unsigned-baseline", action="store_true", help="accept a baseline without a manifest"
    )
    pr.add_argument(
        "--record", default=None, help="append the decision here (default: promotions.jsonl beside NEW)"
    )
    pr.set_defaults(func=cmd_models_promote)
    mlist = models.add_parser("list", help="the model catalog edge dev serves")
    mlist.add_argument("--config", default=None, help=CONFIG_HELP)
    mlist.set_defaults(func=cmd_models_list)
    mrel = models.add_parser("reload", help="have a running edge dev's PoPs load a model's new version")
    mrel.add_argument("model", help="a catalog name")
    mrel.add_argument(
        "--config", default=None, help="its .edge/admin-token is sent (default: as edge dev finds it)"
    )
    mrel.add_argument("--url", default="http://127.0.0.1:8787", help="the running edge dev")
    mrel.set_defaults(func=cmd_models_reload)
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
    capacity_cli.register(sub)
    _show_defaults(parser)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
