"""`edge plan --launch vllm|sglang`: the planner's layout as the launch command of an existing
distributed engine, so a PoP can forward to it (issue 15: full-size models are served by vLLM or
SGLang behind our routing, tenancy and accounting, not by our engine).

Every flag printed is in VLLM_FLAGS or SGLANG_FLAGS, each checked against the engine's own docs
(the URLs below; tests/unit/test_launch_flags.py holds the command to those lists). Formats we
have and the engine lacks are said, not invented: neither engine has an int8 or int4 KV cache,
and a weight format is whatever the checkpoint holds (both read its quantization config), so the
command names the published checkpoint of that format or says that none is published.

Layout mapping (capacity.planner: routed experts EP over all N GPUs; attention TP up to the KV
heads, DP beyond; MLA attention all DP):
    vLLM:   --tensor-parallel-size <attention TP> --data-parallel-size <attention DP>
            --enable-expert-parallel (its EP size is TP x DP = N); past one 8-GPU node, one
            command per node (--data-parallel-size-local, --data-parallel-start-rank, --headless).
    SGLang: --tp N [--dp <attention DP> --enable-dp-attention] --ep-size N; past one node,
            --nnodes / --node-rank / --dist-init-addr on every node.
"""

from __future__ import annotations

import math
import shlex

import msgspec

from capacity.planner import Plan
from edge_sim.roofline import SimulationError

__all__ = [
    "ENGINES",
    "SGLANG_DOCS",
    "SGLANG_FLAGS",
    "VLLM_DOCS",
    "VLLM_FLAGS",
    "LaunchCommand",
    "format_launch",
    "launch_command",
]

GPUS_PER_NODE = 8
HEAD = "HEAD_IP"  # the first node's address, filled in by the operator
DP_RPC_PORT = 13345
SGLANG_INIT_PORT = 20000

# The docs the flag names were checked against (vLLM v0.12.0, SGLang's server-arguments page as
# of its v0.5 releases).
VLLM_DOCS = (
    "https://docs.vllm.ai/en/v0.12.0/serving/data_parallel_deployment/",
    "https://docs.vllm.ai/en/v0.12.0/serving/expert_parallel_deployment/",
    "https://docs.vllm.ai/en/v0.8.5/serving/engine_args.html",
)
SGLANG_DOCS = (
    "https://docs.sglang.io/advanced_features/server_arguments.html",
    "https://docs.sglang.io/cookbook/base/reference/server_arguments",
)
VLLM_FLAGS = frozenset(
    {
        "--tensor-parallel-size",
        "--data-parallel-size",
        "--data-parallel-size-local",
        "--data-parallel-start-rank",
        "--data-parallel-address",
        "--data-parallel-rpc-port",
        "--headless",
        "--enable-expert-parallel",
        "--max-model-len",
        "--kv-cache-dtype",
        "--max-num-seqs",
        "--max-num-batched-tokens",
        "--gpu-memory-utilization",
        "--quantization",
        "--trust-remote-code",
        "--served-model-name",
        "--host",
        "--port",
    }
)
VLLM_KV_CHOICES = ("auto", "fp8", "fp8_e4m3", "fp8_e5m2")
SGLANG_FLAGS = frozenset(
    {
        "--model-path",
        "--tp",
        "--dp",
        "--enable-dp-attention",
        "--ep-size",
        "--kv-cache-dtype",
        "--context-length",
        "--max-running-requests",
        "--mem-fraction-static",
        "--chunked-prefill-size",
        "--quantization",
        "--trust-remote-code",
        "--served-model-name",
        "--host",
        "--port",
        "--nnodes",
        "--node-rank",
        "--dist-init-addr",
    }
)
SGLANG_KV_CHOICES = ("auto", "fp8_e5m2", "fp8_e4m3")
ENGINES = ("vllm", "sglang")

# Our KV formats -> each engine's flag value, or None where it has none. Our fp8 KV is e4m3 with
# scales (kernels.formats); both engines' fp8_e4m3 is the same element type.
_KV = {
    "vllm": {"auto": "auto", "bf16": "auto", "fp8": "fp8_e4m3", "int8": None, "int4": None},
    "sglang": {"auto": "auto", "bf16": "auto", "fp8": "fp8_e4m3", "int8": None, "int4": None},
}

# Published checkpoints per model and weight format; None: none published (the operator names
# one with `--checkpoint`).
CHECKPOINTS: dict[str, dict[str, str | None]] = {
    "kimi-k2": {
        "fp8": "moonshotai/Kimi-K2-Instruct",  # block-scaled FP8, as released
        "bf16": None,
        "int8": None,
        "int4": None,  # moonshotai/Kimi-K2-Thinking is INT4, but it is another model
    },
    "glm-4.5": {
        "bf16": "zai-org/GLM-4.5",
        "fp8": "zai-org/GLM-4.5-FP8",
        "int8": None,
        "int4": None,
    },
}
_REMOTE_CODE = {"kimi-k2"}  # its tokenizer ships as remote code


class LaunchCommand(msgspec.Struct):
    """One engine's command lines for one replica of the plan: one per node, head first."""

    engine: str
    model: str
    checkpoint: str
    gpus: int
    nodes: list[list[str]]  # argv per node
    notes: list[str]  # what the command does not say, or says differently from the plan


def _checkpoint(plan: Plan, override: str | None) -> tuple[str, list[str]]:
    if override:
        return override, [f"checkpoint {override} given by the operator: it must hold {plan.weights} weights"]
    repo = CHECKPOINTS.get(plan.model, {}).get(plan.weights)
    if repo:
        return repo, []
    published = ", ".join(f"{f}: {r}" for f, r in CHECKPOINTS.get(plan.model, {}).items() if r) or "none"
    return f"/path/to/{plan.model}-{plan.weights}", [
        f"no published {plan.weights} checkpoint of {plan.model} is known (published: {published}); "
        f"pass one with --checkpoint. The engine reads the format from the checkpoint's quantization "
        f"config, so its bytes per weight may differ from ours"
    ]


def _kv(engine: str, plan: Plan) -> tuple[str, list[str]]:
    value = _KV[engine][plan.kv]
    if value is not None:
        return value, []
    choices = ", ".join(VLLM_KV_CHOICES if engine == "vllm" else SGLANG_KV_CHOICES)
    return "auto", [
        f"{engine} has no {plan.kv} KV cache (--kv-cache-dtype choices: {choices}); the command keeps the "
        f"model's dtype, so it holds fewer sequences than this plan: plan with --kv fp8 for a launch "
        f"that matches"
    ]


def _split(gpus: int) -> int:
    """Nodes of 8 GPUs a replica spans (the planner's layouts past 8 are whole nodes)."""
    return max(1, math.ceil(gpus / GPUS_PER_NODE))


def _vllm(plan: Plan, ckpt: str, kv: str, name: str, port: int) -> tuple[list[list[str]], list[str]]:
    lay = plan.layout
    tp, dp = lay.tensor_parallel_attention, lay.data_parallel_attention
    # max-num-seqs and max-num-batched-tokens are per engine core, one per DP rank
    per_rank = math.ceil(plan.concurrency / dp)
    common = [
        "--tensor-parallel-size", str(tp), *(["--data-parallel-size", str(dp)] if dp > 1 else []),
        "--enable-expert-parallel", "--max-model-len", str(plan.context), "--kv-cache-dtype", kv,
        "--max-num-seqs", str(per_rank), "--max-num-batched-tokens", str(plan.prefill_chunk),
        "--gpu-memory-utilization", f"{plan.usable_fraction:g}",
        *(["--trust-remote-code"] if plan.model in _REMOTE_CODE else []),
    ]  # fmt: skip
    notes = []
    if dp > 1:
        notes.append(
            f"--max-num-seqs {per_rank} is per DP rank: {dp} ranks x {per_rank} >= {plan.concurrency}"
        )
    nodes = _split(lay.gpus)
    if nodes == 1:
        argv = ["vllm", "serve", ckpt, *common, "--served-model-name", name, "--host", "0.0.0.0"]
        return [[*argv, "--port", str(port)]], notes
    local = dp // nodes
    cluster = [
        "--data-parallel-size-local", str(local), "--data-parallel-address", HEAD,
        "--data-parallel-rpc-port", str(DP_RPC_PORT),
    ]  # fmt: skip
    head = ["vllm", "serve", ckpt, *common, *cluster, "--served-model-name", name, "--host", "0.0.0.0"]
    out = [[*head, "--port", str(port)]]
    for k in range(1, nodes):
        rank = ["--headless", "--data-parallel-start-rank", str(k * local)]
        out.append(["vllm", "serve", ckpt, *common, *cluster, *rank])
    notes.append(f"{nodes} nodes of {GPUS_PER_NODE}: replace {HEAD} with the first node's address")
    return out, notes


def _sglang(plan: Plan, ckpt: str, kv: str, name: str, port: int) -> tuple[list[list[str]], list[str]]:
    lay = plan.layout
    dp = lay.data_parallel_attention
    common = [
        "python", "-m", "sglang.launch_server", "--model-path", ckpt, "--tp", str(lay.gpus),
        *(["--dp", str(dp), "--enable-dp-attention"] if dp > 1 else []),
        "--ep-size", str(lay.expert_parallel),
        "--kv-cache-dtype", kv, "--context-length", str(plan.context),
        "--max-running-requests", str(plan.concurrency), "--mem-fraction-static", f"{plan.usable_fraction:g}",
        "--chunked-prefill-size", str(plan.prefill_chunk),
        *(["--trust-remote-code"] if plan.model in _REMOTE_CODE else []),
        "--served-model-name", name, "--host", "0.0.0.0", "--port", str(port),
    ]  # fmt: skip
    nodes = _split(lay.gpus)
    if nodes == 1:
        return [common], []
    cluster = ["--nnodes", str(nodes), "--dist-init-addr", f"{HEAD}:{SGLANG_INIT_PORT}"]
    out = [[*common, *cluster, "--node-rank", str(k)] for k in range(nodes)]
    return out, [f"{nodes} nodes of {GPUS_PER_NODE}: replace {HEAD} with the first node's address"]


def launch_command(
    plan: Plan,
    engine: str,
    *,
    checkpoint: str | None = None,
    served_name: str | None = None,
    port: int = 8000,
) -> LaunchCommand:
    """The plan's layout as `engine`'s launch command (one replica)."""
    if engine not in ENGINES:
        raise SimulationError(f"--launch: unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
    if not 0 < port < 65536:
        raise SimulationError(f"--port must be in 1..65535, got {port!r}")
    lay = plan.layout
    if lay.gpus > GPUS_PER_NODE and lay.gpus % GPUS_PER_NODE:
        raise SimulationError(f"a {lay.gpus}-GPU layout is not whole nodes of {GPUS_PER_NODE}")
    ckpt, notes = _checkpoint(plan, checkpoint)
    kv, kv_notes = _kv(engine, plan)
    name = served_name or plan.model
    build = _vllm if engine == "vllm" else _sglang
    nodes, layout_notes = build(plan, ckpt, kv, name, port)
    if checkpoint is None and plan.weights == "bf16" and CHECKPOINTS.get(plan.model, {}).get("bf16") is None:
        notes.append("the published weights are not bf16: an upcast copy is needed")
    return LaunchCommand(engine, plan.model, ckpt, lay.gpus, nodes, [*notes, *kv_notes, *layout_notes])


def flags_of(argv: list[str]) -> list[str]:
    """The --flags of one command line."""
    return [a for a in argv if a.startswith("--")]


def format_launch(cmd: LaunchCommand) -> str:
    """The command lines as shell, one flag and its value per line, with the notes after."""
    lines = [f"# {cmd.engine}: one replica of {cmd.model} on {cmd.gpus} GPUs"]
    for i, argv in enumerate(cmd.nodes):
        if len(cmd.nodes) > 1:
            lines.append(f"# node {i}{' (head: serves HTTP)' if i == 0 else ''}")
        head, rest = [], list(argv)
        while rest and not rest[0].startswith("--"):
            head.append(rest.pop(0))
        parts = [" ".join(shlex.quote(a) for a in head)]
        while rest:
            flag = rest.pop(0)
            value = rest.pop(0) if rest and not rest[0].startswith("--") else None
            parts.append(flag if value is None else f"{flag} {shlex.quote(value)}")
        lines.append(" \\\n    ".join(parts))
    lines += [f"# note: {n}" for n in cmd.notes]
    return "\n".join(lines)
