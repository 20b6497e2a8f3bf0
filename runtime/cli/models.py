"""Model tools: edge models info, quantize, eval, keygen, sign, verify, promote and list."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.cli.common import CONFIG_HELP, _fail
from runtime.control.config import ConfigError, load_config


def _mib(n: int) -> str:
    return f"{n / 2**20:.2f}"


def cmd_models_info(args: argparse.Namespace) -> int:
    import msgspec

    from engine.errors import ModelLoadError
    from engine.load.checkpoint import checkpoint_info

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
    from engine.errors import ModelLoadError
    from engine.load.checkpoint import quantize_checkpoint

    try:
        sizes = quantize_checkpoint(args.src, args.dst, args.weights, args.parts)
    except ModelLoadError as exc:
        return _fail(str(exc))
    before, after = sizes["bytes_before"], sizes["bytes_after"]
    print(f"wrote {args.dst}: {_mib(before)} MiB -> {_mib(after)} MiB of tensors ({after / before:.3f}x)")
    return 0


def _split(text: str) -> list[str]:
    return [x.strip() for x in text.split(",") if x.strip()]


def cmd_models_eval(args: argparse.Namespace) -> int:
    if args.chat:
        return cmd_models_eval_chat(args)

    from engine.errors import EngineError
    from quality.perplexity import evaluate, format_table

    given = args.contexts or "256,1024,2048"
    try:
        contexts = [int(c) for c in _split(given)]
    except ValueError:
        return _fail(f"--contexts {given!r}: give token counts such as 256,1024,2048")
    try:
        rows = evaluate(
            _model_dir(args.model, args.config),
            _split(args.kv or "auto,fp8,int8,int4"),
            contexts,
            weights=_split(args.weights),
            text=args.text,
            max_windows=args.max_windows,
            trusted_keys=args.pubkey or None,
            allow_unsigned=args.allow_unsigned,
        )
    except (EngineError, ConfigError) as exc:
        return _fail(str(exc))
    _report(args, rows, format_table, lambda: quality_record_path(_model_dir(args.model, args.config)))
    return 0


def _report(args: argparse.Namespace, rows, format_table, record_path) -> None:
    """An evaluation's rows as a table or JSON (`--json`), and with `--record` written to
    `record_path()` (its line on stderr under --json, so stdout stays JSON)."""
    import msgspec

    if args.json:
        print(msgspec.json.encode(rows).decode())
    else:
        print(format_table(rows))
    if args.record:
        path = record_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(msgspec.json.format(msgspec.json.encode(rows), indent=2) + b"\n")
        print(f"recorded in {path}", file=sys.stderr if args.json else sys.stdout)


def cmd_models_eval_chat(args: argparse.Namespace) -> int:
    """`edge models eval MODEL --chat`: chat, tool-call and JSON scores per weights x KV setting."""

    from engine.errors import EngineError
    from quality.chat_eval import Budget, Perplexity, evaluate_chat, format_table
    from quality.chat_prompts import load_prompts

    try:
        model_dir = _model_dir(args.model, args.config)
        context = int(_split(args.contexts or "1024")[0])
    except ConfigError as exc:
        return _fail(str(exc))
    except (ValueError, IndexError):
        return _fail(f"--contexts {args.contexts!r}: give the perplexity's context, such as 1024")
    paths = args.prompts or [Path(model_dir).parent / "eval" / "chat" / "heldout.jsonl"]
    try:
        prompts = load_prompts(paths, args.limit)
    except FileNotFoundError as exc:  # the held-out prompts are written apart from the models
        print(f"edge: error: {exc} (give one with --prompts PATH)", file=sys.stderr)
        return 1
    except ValueError as exc:
        return _fail(str(exc))
    if not prompts:
        return _fail(f"no prompts in {', '.join(map(str, paths))}")
    try:
        rows = evaluate_chat(
            model_dir,
            prompts,
            weights=_split(args.weights),
            kv_dtypes=_split(args.kv or "auto"),
            seeds=args.seeds,
            budget=Budget(args.tool_max_tokens, args.max_tokens),
            perplexity=Perplexity(context, args.max_windows or 4, args.text) if context > 0 else None,
            trusted_keys=args.pubkey or None,
            allow_unsigned=args.allow_unsigned,
            model=args.model,
        )
    except (EngineError, ConfigError) as exc:
        return _fail(str(exc))
    _report(args, rows, format_table, lambda: chat_record_path(Path(model_dir)))
    return 0


def chat_record_path(model_dir: Path) -> Path:
    """Beside the perplexity record: models/quality/<model-folder>.chat.json."""
    return quality_record_path(model_dir).with_name(f"{model_dir.name}.chat.json")


def quality_record_path(model_dir):
    from runtime.ai.catalog import quality_path

    return quality_path(model_dir)


def _model_dir(model: str, config_path: str | None):
    """A catalog name (with the config's models folder) or a model directory."""
    from pathlib import Path

    if Path(model).is_dir():
        return Path(model)
    from runtime.ai.catalog import load_catalog

    catalog = load_catalog(load_config(config_path).models_dir)
    if model not in catalog:
        raise ConfigError(f"{model!r} is neither a model directory nor in the catalog ({', '.join(catalog)})")
    return catalog[model][1]


def cmd_models_keygen(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.load.integrity import keygen

    keyfile = Path(args.keyfile)
    if keyfile.exists() and not args.force:
        return _fail(f"{keyfile} exists; pass --force to replace it")
    pub = keygen(keyfile)
    print(f"wrote {keyfile} (private, keep it secret) and {pub} (public, give it to whoever verifies)")
    return 0


def cmd_models_sign(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.errors import ModelLoadError
    from engine.load.integrity import sign

    try:
        out = sign(Path(args.dir), Path(args.key), Path(args.source) if args.source else None)
    except ModelLoadError as exc:
        return _fail(str(exc))
    print(f"wrote {out}")
    return 0


def cmd_models_verify(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.errors import ModelLoadError
    from engine.load.integrity import MANIFEST, load_public_key, verify
    from engine.load.verified_load import default_trusted_keys

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
    from engine.errors import EngineError
    from runtime.cli.model_gate import print_quality, quality_gate
    from runtime.control.rollout import append_history, history_path

    try:
        limit = float(args.max_ppl_increase.rstrip("%"))
        contexts = [int(c) for c in args.contexts.split(",") if c.strip()]
    except ValueError:
        return _fail(
            "--max-ppl-increase takes a percentage such as 1% and --contexts token counts such as 256,1024"
        )
    new, old = Path(args.new), Path(args.baseline)
    try:
        gate = quality_gate(
            new, old, contexts, limit, args.min_agreement, args.pubkey or None, args.allow_unsigned_baseline,
            args.text, args.max_windows,
        )  # fmt: skip
    except EngineError as exc:
        print(f"REFUSED {new}: {exc}", file=sys.stderr)
        return 1
    print_quality(gate)
    failures = gate.failures
    record = {
        "new": str(new),
        "baseline": str(old),
        "promoted": not failures,
        "reasons": failures,
        "signed_by": gate.signed_by,
        "verification_seconds": round(gate.verification_s, 3),
        "evaluation_seconds": round(gate.evaluation_s, 3),
        "rows": [msgspec_builtins(r) for r in gate.rows],
    }
    log_path = history_path(new, args.record)
    append_history(log_path, record)
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
    from engine.load.integrity import MANIFEST, load_public_key, verify
    from engine.load.verified_load import default_trusted_keys
    from runtime.ai.catalog import load_catalog

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


def add_model_parsers(models) -> None:
    """The model tools, under the `models` group."""
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
    ev = models.add_parser(
        "eval", help="perplexity and greedy agreement per KV / weight setting (--chat: chat scores)"
    )
    ev.add_argument("model", help="a model directory or catalog name")
    ev.add_argument(
        "--kv", default=None, help="KV dtypes, comma-separated (default: auto,fp8,int8,int4; --chat: auto)"
    )
    ev.add_argument(
        "--weights", default="auto", help="weight formats, comma-separated (first is the baseline)"
    )
    ev.add_argument(
        "--contexts",
        default=None,
        help="context lengths, comma-separated (default: 256,1024,2048; --chat: the perplexity's one "
        "context, 1024, 0 for none)",
    )
    ev.add_argument("--text", default=None, help="held-out text (default: the model's)")
    ev.add_argument(
        "--max-windows", type=int, default=None, help="cap on windows per context (--chat default: 4)"
    )
    chat = ev.add_argument_group("chat evaluation (--chat)")
    chat.add_argument(
        "--chat", action="store_true", help="score chat, tool calls and JSON on held-out prompts instead"
    )
    chat.add_argument(
        "--prompts",
        nargs="+",
        default=None,
        help="JSON-lines prompt files (default: eval/chat/heldout.jsonl beside the model's folder)",
    )
    chat.add_argument("--seeds", type=int, default=3, help="temperature-1 samples per tool prompt")
    chat.add_argument("--limit", type=int, default=None, help="at most this many prompts of each kind")
    chat.add_argument("--max-tokens", type=int, default=128, help="max_tokens of a reply in words")
    chat.add_argument("--tool-max-tokens", type=int, default=96, help="max_tokens of a tool prompt's reply")
    ev.add_argument("--config", default=None, help=CONFIG_HELP)
    ev.add_argument("--json", action="store_true", help="print JSON")
    ev.add_argument("--pubkey", action="append", help="trusted public key (repeatable; default: models/keys)")
    ev.add_argument("--allow-unsigned", action="store_true", help="evaluate a model without a manifest")
    ev.add_argument(
        "--record",
        action="store_true",
        help="keep the results for the catalog (models/quality/; --chat: <model-folder>.chat.json)",
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
