"""Building blocks shared by the architectures: norms, rotary embeddings, dense MLP, routed MoE.

Modules are plain classes holding tensors (inference only); each takes its weights from a
`Tensors` mapping by checkpoint name, so the checkpoint layout is the single source of truth.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
import torch.nn.functional as F

import kernels
from engine.arch.config import ModelConfig, RopeSpec
from engine.models import eager_ops
from kernels import dispatch, native_ops
from kernels.quant import QuantizedWeight, concat_out, rows_of, stack

Tensors = Mapping[str, "torch.Tensor | QuantizedWeight"]


def dense(w: torch.Tensor | QuantizedWeight, dtype: torch.dtype) -> torch.Tensor:
    """A weight used inside an einsum (MLA's absorbed projections) must be dense, and in `dtype`: a
    bf16 matrix kept bf16 on a CPU (kernels.dispatch.keeps_bf16) is folded in float32."""
    return w.dequantize(dtype) if isinstance(w, QuantizedWeight) else w.to(dtype)


class RMSNorm:
    """The implementation is picked once (kernels.dispatch), not per call: a decode step runs
    dozens of norms and the per-call choice showed up in profiles."""

    def __init__(self, weight: torch.Tensor, eps: float):
        self.weight = weight
        self.eps = eps
        self._fn = kernels.rms_norm_for(weight)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self._fn(x, self.weight, self.eps)


class Linear:
    """y = x W^T (+ b) for a checkpoint weight W [out, in], dense or compressed.

    A dense float32 weight on a CPU with the fused ops built stays [out, in] and every product goes
    through the C kernel (edge_cpu::linear): 1.0-3.8x MKL's here with the weights streamed from memory
    as a step streams them, 1.6x at 512 rows (bench/dense_linear.py), and a row's result is the same
    bits at every batch size and in prefill and decode alike (MKL's are not), so a sequence decoded
    beside others, alone, or recomputed after a preemption computes the same keys and values. A
    bf16 weight kept bf16 on a CPU (kernels.dispatch.keeps_bf16) is read so too, as stored (half the
    bytes; x and y stay float32).
    Otherwise (no build) a dense weight is kept transposed ([in, out], contiguous): for the few rows of
    a decode step a plain x @ W^T on that layout is faster on CPUs than linear() on [out, in].

    Which op runs is kernels.dispatch.linear_op's choice (eager, and inside a compiled step); this
    layer keeps the weight in the layout that op reads and calls it.
    """

    def __init__(self, weight: torch.Tensor | QuantizedWeight, bias: torch.Tensor | None = None):
        self.bias = bias
        self.out_features = weight.shape[-2]
        self.handle = -1  # numbered by the model (eager_ops.number_parts) when it is an eager part
        self.op = dispatch.linear_op(weight)  # eager
        self.graph_op = dispatch.linear_op(weight, compiled=True)  # inside a compiled step
        # the native op's activation format for an int8 / int4 W ("f32", or "a8": EDGE_CPU_ACTIVATIONS),
        # or a bf16 W ("f32", or "bf16x2")
        self.activations = dispatch.linear_activations(weight)
        self.rows: torch.Tensor | None = None  # a dense float32 / bfloat16 W [out, in] the C kernel reads
        self.quantized: QuantizedWeight | native_ops.RepackedInt8 | None
        if isinstance(weight, QuantizedWeight):
            self.quantized, self.weight_t = weight, None
            if self.op == dispatch.NATIVE_LINEAR and dispatch.repacks(weight.format, self.activations):
                # int8 with 8-bit activations: four rows a stream for the op, the only reader (not kept twice)
                self.quantized = native_ops.repack_int8(weight)
        elif self.op == dispatch.NATIVE_LINEAR:
            self.rows = weight.contiguous()
            self.quantized, self.weight_t = None, None
        else:
            self.quantized, self.weight_t = None, weight.t().contiguous()

    @property
    def weight(self) -> torch.Tensor | QuantizedWeight:
        if self.rows is not None:
            return self.rows
        if isinstance(self.quantized, native_ops.RepackedInt8):
            return self.quantized.unpack()  # a copy, as stored (at load: the layers' own checks)
        return self.quantized if self.quantized is not None else self.weight_t.t()

    @property
    def eager_part(self) -> bool:
        """A compiled step calls a compressed weight's matmul that no native op takes (fp8, or no
        build) as an opaque Python op (eager_ops)."""
        return self.graph_op == dispatch.EAGER_LINEAR

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        op = self.op
        if op == dispatch.NATIVE_LINEAR:  # one C++ op, eager or inside a compiled graph
            if self.rows is not None:
                return native_ops.linear_dense(x, self.rows, self.bias, self.activations)
            return native_ops.linear(x, self.quantized, self.bias, self.activations)
        if op == dispatch.MATMUL:
            y = torch.matmul(x, self.weight_t)
            return y if self.bias is None else y + self.bias
        if eager_ops.in_compiled_step():
            op = self.graph_op
        if op == dispatch.EAGER_LINEAR:
            return eager_ops.quantized_linear(x, self.handle)
        return self.eager(x)

    def eager(self, x: torch.Tensor) -> torch.Tensor:
        return kernels.linear(x, self.quantized, self.bias)


def linear(t: Tensors, prefix: str, bias: bool = False) -> Linear:
    return Linear(t[f"{prefix}.weight"], t[f"{prefix}.bias"] if bias else None)


class LMHead:
    """Logits h W^T for the head W [vocab, hidden], in float32. A bf16 head kept bf16 on a CPU
    (kernels.dispatch.keeps_bf16) is read as stored by edge_cpu::linear (half the bytes of the decode
    step's largest product); any other stays on torch's matmul with W kept [hidden, vocab] (its fast
    layout for the few rows of a step), as before."""

    def __init__(self, weight: torch.Tensor):
        native = weight.dtype == torch.bfloat16 and dispatch.linear_op(weight) == dispatch.NATIVE_LINEAR
        self.rows = weight.contiguous() if native else None  # bf16 [vocab, hidden]
        self.weight_t = None if native else weight.t().contiguous()  # [hidden, vocab]
        self.activations = dispatch.linear_activations(weight) if native else dispatch.DEFAULT_ACTIVATION

    @property
    def weight(self) -> torch.Tensor:
        """W [vocab, hidden] as the checkpoint has it (a view where it is kept transposed)."""
        return self.rows if self.rows is not None else self.weight_t.t()

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.rows is not None:
            return native_ops.linear_dense(hidden, self.rows, None, self.activations).to(torch.float32)
        return torch.matmul(hidden, self.weight_t).to(torch.float32)


# --- rotary embeddings --------------------------------------------------------------------------


def _yarn_mscale(scale: float, mscale: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def softmax_scale(head_dim: int, rope: RopeSpec) -> float:
    """1/sqrt(d), times YaRN's mscale(factor, mscale_all_dim)^2 as DeepSeek-V3 applies it."""
    scale = head_dim**-0.5
    if rope.type == "yarn" and rope.mscale_all_dim:
        m = _yarn_mscale(rope.factor, rope.mscale_all_dim)
        scale *= m * m
    return scale


def rope_inv_freq(dim: int, rope: RopeSpec) -> tuple[torch.Tensor, float]:
    """Inverse frequencies for `dim` rotary dims and the cos/sin scaling (YaRN's attention factor)."""
    pos_freqs = rope.theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim)
    if rope.type == "default":
        return 1.0 / pos_freqs, 1.0
    # YaRN: interpolate low frequencies by `factor`, keep high ones, ramp in between.
    factor = rope.factor
    if rope.attention_factor is not None:
        attention_factor = rope.attention_factor
    elif rope.mscale and rope.mscale_all_dim:
        attention_factor = _yarn_mscale(factor, rope.mscale) / _yarn_mscale(factor, rope.mscale_all_dim)
    else:
        attention_factor = _yarn_mscale(factor)
    original = rope.original_max_position_embeddings

    def correction_dim(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = torch.clamp((torch.arange(dim // 2, dtype=torch.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (1.0 / pos_freqs) * extrapolation
    return inv_freq, float(attention_factor)


class RopeTables:
    """cos/sin of every token's angles for one forward pass, shared by all layers."""

    def __init__(self, freqs: torch.Tensor, factor: float, dtype: torch.dtype):
        self.cos = (freqs.cos() * factor).to(dtype)
        self.sin = (freqs.sin() * factor).to(dtype)
        # complex form for interleaved pairs in float32: one multiply instead of six ops (eager only:
        # inductor has no complex kernels, so a compiled step does the same product in reals)
        self.cis = None
        if dtype == torch.float32 and not eager_ops.in_compiled_step():
            self.cis = torch.polar(torch.full_like(freqs, factor), freqs)


class Rotary:
    """Applies RoPE to the first `dim` features; `interleaved` pairs (x0,x1),(x2,x3) as DeepSeek does.

    Queries and keys always share one output layout (pairs kept interleaved on the complex path,
    [first halves | second halves] otherwise), so their dot products are those of the original
    pairing; the cache stores keys in that same layout.
    """

    def __init__(self, dim: int, rope: RopeSpec, interleaved: bool, device: torch.device | None = None):
        self.dim = dim
        inv_freq, self.attention_factor = rope_inv_freq(dim, rope)
        self.inv_freq = inv_freq.to(device) if device is not None else inv_freq
        self.interleaved = interleaved

    def tables(self, positions: torch.Tensor, dtype: torch.dtype) -> RopeTables:
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        return RopeTables(freqs, self.attention_factor, dtype)

    def apply(self, x: torch.Tensor, rope: RopeTables) -> torch.Tensor:
        """x: [tokens, heads, dim] (contiguous)."""
        if self.interleaved and rope.cis is not None:
            pairs = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2))
            return torch.view_as_real(pairs * rope.cis[:, None, :]).flatten(-2)
        cos, sin = rope.cos[:, None, :], rope.sin[:, None, :]
        if self.interleaved:
            x1, x2 = x[..., 0::2], x[..., 1::2]
            if x.dtype == torch.float32:  # the complex path's product, its interleaved layout kept
                return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
        else:
            x1, x2 = x.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


# --- feed-forward -----------------------------------------------------------------------------


class MLP:
    """SwiGLU: down(silu(gate(x)) * up(x)); gate and up run as one matmul when both are dense or
    both int8 / int4 (their rows concatenated: one compressed-weight call instead of two)."""

    def __init__(self, t: Tensors, prefix: str):
        gate, up = t[f"{prefix}.gate_proj.weight"], t[f"{prefix}.up_proj.weight"]
        both_quantized = isinstance(gate, QuantizedWeight) and isinstance(up, QuantizedWeight)
        joined = concat_out([gate, up]) if both_quantized else None
        self.fused = joined is not None or not (
            isinstance(gate, QuantizedWeight) or isinstance(up, QuantizedWeight)
        )
        if joined is not None:
            self.gate_up = Linear(joined)
        elif self.fused:
            self.gate_up = Linear(torch.cat([gate, up]))
        else:
            self.gate, self.up = Linear(gate), Linear(up)
        self.down = linear(t, f"{prefix}.down_proj")

    def __call__(self, x: torch.Tensor, batch=None) -> torch.Tensor:
        """`batch` (the step's) is unused: a decoder layer calls its MLP and its MoE alike."""
        if self.fused:
            gate, up = self.gate_up(x).chunk(2, dim=-1)
            return self.down(F.silu(gate) * up)
        return self.down(F.silu(self.gate(x)) * self.up(x))


def mlp_tensors(prefix: str, hidden: int, intermediate: int) -> dict[str, tuple[int, ...]]:
    return {
        f"{prefix}.gate_proj.weight": (intermediate, hidden),
        f"{prefix}.up_proj.weight": (intermediate, hidden),
        f"{prefix}.down_proj.weight": (hidden, intermediate),
    }


class SigmoidRouter:
    """DeepSeek-V3 routing: sigmoid scores, bias-corrected group-limited top-k (noaux_tc)."""

    def __init__(self, t: Tensors, prefix: str, c: ModelConfig):
        self.weight_t = t[f"{prefix}.weight"].to(torch.float32).t().contiguous()
        self.bias = t[f"{prefix}.e_score_correction_bias"].to(torch.float32)
        self.top_k = c.num_experts_per_tok
        self.n_group = c.n_group
        self.topk_group = c.topk_group
        self.norm_topk_prob = c.norm_topk_prob
        self.scale = c.routed_scaling_factor

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: [tokens, hidden] -> (weights [tokens, k] float32, expert ids [tokens, k])."""
        scores = torch.matmul(x if x.dtype == torch.float32 else x.float(), self.weight_t).sigmoid()
        choice = scores + self.bias
        if self.n_group > 1:
            n = x.shape[0]
            grouped = choice.view(n, self.n_group, -1)
            group_scores = grouped.topk(2, dim=-1).values.sum(dim=-1)
            keep = torch.zeros_like(group_scores, dtype=torch.bool)
            keep.scatter_(1, group_scores.topk(self.topk_group, dim=-1, sorted=False).indices, True)
            choice = grouped.masked_fill(~keep[:, :, None], float("-inf")).view(n, -1)
        ids = choice.topk(self.top_k, dim=-1, sorted=False).indices
        weights = scores.gather(1, ids)
        if self.norm_topk_prob:
            return weights * (self.scale / (weights.sum(dim=-1, keepdim=True) + 1e-20)), ids
        return weights * self.scale, ids


class RoutedExperts:
    """The routed experts, stacked per projection ([E, out, in]); gate and up stacked together
    ([E, 2I, in]) when dense, so each expert runs two matmuls.

    On a CPU: the (token, expert) pairs sorted by expert, the tokens gathered once in that order,
    each active expert's rows run as one slice of that batch into one output buffer, then one
    weighting and one index_add_ for all pairs. The only host read is the expert ids (batch 1-2)
    or the per-expert counts, once per layer. kernels.moe.fused_moe_ref is the reference."""

    PAIR_LOOP_MAX = 4  # up to this many (token, expert) pairs, skip sorting: 1-2 tokens (batch 1-2, a verify)

    def __init__(self, t: Tensors, prefix: str, num_experts: int):
        def stacked(proj: str) -> torch.Tensor | QuantizedWeight:
            weights = [t[f"{prefix}.{e}.{proj}.weight"] for e in range(num_experts)]
            if isinstance(weights[0], QuantizedWeight):
                return stack(weights)
            return torch.stack(weights)

        gate, up, down = stacked("gate_proj"), stacked("up_proj"), stacked("down_proj")
        self.fused = isinstance(gate, torch.Tensor) and isinstance(up, torch.Tensor)
        inter = gate.shape[-2]
        # the experts stacked as a fused op would read them (w13 [E, 2I, H]: gate rows, then up rows;
        # w2 [E, H, I]), where they can be stacked so; kernels.dispatch says whether one runs
        w13: torch.Tensor | QuantizedWeight | None = None
        w2: torch.Tensor | QuantizedWeight | None = None
        if self.fused:  # dense: w13 [E, 2I, in] (gate rows, then up rows) and w2 [E, in, I], stored once
            self.w13 = torch.cat([gate, up], dim=1).contiguous()
            self.w2 = down.contiguous()
            self.w_gate_up_t, self.w_down_t = self.w13.transpose(1, 2), self.w2.transpose(1, 2)
            # per-expert [in, out] views for the eager loop, indexed in Python: no select op per call
            self._gate_up = list(self.w_gate_up_t.unbind(0))
            self._down = list(self.w_down_t.unbind(0))
            w13, w2 = self.w13, self.w2
        else:
            self.w_gate, self.w_up, self.w_down = gate, up, down
        # int8 / int4 on a CPU: gate and up rows of each expert stored as one weight (w_gate and w_up
        # are views of it), one compressed-weight call for both; per-expert weights split once here
        self._q_gate_up: list[QuantizedWeight] | None = None
        joined = None
        if not self.fused and isinstance(gate, QuantizedWeight) and gate.data.device.type == "cpu":
            joined = concat_out([gate, up])
        if joined is not None:
            assert isinstance(down, QuantizedWeight)
            i = gate.shape[-2]
            self.w_gate, self.w_up = rows_of(joined, 0, i), rows_of(joined, i, 2 * i)
            self._q_gate_up = [joined[e] for e in range(num_experts)]
            self._q_down = [down[e] for e in range(num_experts)]
            w13, w2 = joined, down
        self.op = dispatch.experts_op(w13, w2, inter)  # eager
        self.graph_op = dispatch.experts_op(w13, w2, inter, compiled=True)  # inside a compiled step
        # the fused op's arguments (kernels.native_ops.fused_moe) where it runs, else None
        self.native: tuple | None = None
        # the native op's activation format for int8 / int4 experts ("f32", or "a8": EDGE_CPU_ACTIVATIONS),
        # or bf16 ones ("f32", or "bf16x2")
        self.activations = dispatch.experts_activations(w13, w2, inter)
        if self.op == dispatch.NATIVE_MOE:
            assert w13 is not None and w2 is not None
            self.native = native_ops.experts_args(w13, w2, inter)
            if dispatch.repacks(self.native[4], self.activations):
                # int8 with 8-bit activations: each expert's rows four to a stream for the op, which is
                # then their only reader (the stacks as stored, for the eager loop, are not kept too)
                w13p, w2p = native_ops.repack_int8(w13), native_ops.repack_int8(w2)
                self.native = (w13p.data, w13p.scale, w2p.data, w2p.scale, w13p.format, inter)
                self.w_gate = self.w_up = self.w_down = None
                self._q_gate_up = self._q_down = None
        self.num_experts = num_experts

    def _expert(self, e: int, h: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
        if self.fused:
            gate, up = torch.matmul(h, self._gate_up[e]).chunk(2, dim=-1)
            return torch.matmul(F.silu(gate) * up, self._down[e], out=out)
        if self._q_gate_up is not None:
            gate, up = kernels.linear(h, self._q_gate_up[e]).chunk(2, dim=-1)
            y = kernels.linear(F.silu(gate) * up, self._q_down[e])
            return y if out is None else out.copy_(y)
        gate, up = kernels.linear(h, self.w_gate[e]), kernels.linear(h, self.w_up[e])
        y = kernels.linear(F.silu(gate) * up, self.w_down[e])
        return y if out is None else out.copy_(y)

    def run_native(self, x, weights, ids, load: torch.Tensor, real_rows: torch.Tensor | None) -> torch.Tensor:
        """The native op's sum (kernels.native_ops.fused_moe: one C++ call, tokens counted inside
        and added to `load`); only where `native` is set."""
        assert self.native is not None
        w13, s13, w2, s2, fmt, inter = self.native
        return native_ops.fused_moe(
            x, weights, ids, w13, s13, w2, s2, fmt, inter, load, real_rows, self.activations
        )

    def __call__(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """Sum over each token's k experts of weight * expert(x); only experts with tokens run."""
        if kernels.use_triton(x):  # one grouped-GEMM launch per projection over all active experts
            if self.fused:
                i = self.w_gate_up_t.shape[2] // 2
                w = self.w_gate_up_t.transpose(1, 2)  # [E, 2I, H] views, no copy
                return kernels.fused_moe(x, weights, ids, w[:, :i], w[:, i:], self.w_down_t.transpose(1, 2))
            return kernels.fused_moe(x, weights, ids, self.w_gate, self.w_up, self.w_down)
        flat_ids, flat_weights = ids.reshape(-1), weights.reshape(-1, 1).to(x.dtype)
        if flat_ids.numel() <= self.PAIR_LOOP_MAX:  # one or two tokens (a verify's rows): no sort
            k, pairs = ids.shape[1], list(zip(flat_ids.tolist(), flat_weights.unbind(0), strict=True))
            rows = []
            for r in range(ids.shape[0]):
                acc, h = None, x[r : r + 1]
                for e, w in pairs[r * k : (r + 1) * k]:
                    y = self._expert(e, h)
                    acc = y * w if acc is None else torch.addcmul(acc, y, w)
                rows.append(acc)
            return rows[0] if len(rows) == 1 else torch.cat(rows)
        order = flat_ids.argsort(stable=True)
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        token_of_slot = order // ids.shape[1]
        xs = x.index_select(0, token_of_slot)
        ys = torch.empty_like(xs)
        start = 0
        for expert, count in enumerate(counts):
            if count:
                self._expert(expert, xs[start : start + count], out=ys[start : start + count])
                start += count
        ys.mul_(flat_weights.index_select(0, order))
        return torch.zeros_like(x).index_add_(0, token_of_slot, ys)


class MoE:
    def __init__(self, t: Tensors, prefix: str, c: ModelConfig):
        self.router = SigmoidRouter(t, f"{prefix}.gate", c)
        self.experts = RoutedExperts(t, f"{prefix}.experts", c.n_routed_experts)
        self.shared = MLP(t, f"{prefix}.shared_experts") if c.n_shared_experts else None
        self.num_experts = c.n_routed_experts
        self._load = torch.zeros(c.n_routed_experts, dtype=torch.int64)
        self._pending: list[torch.Tensor] = []  # routed ids not yet counted (counted in bulk: cheaper)
        self.handle = -1  # a compiled step runs `routed` as an opaque op (eager_ops.number_parts)

    @property
    def eager_part(self) -> bool:
        """A compiled step runs `routed` as an opaque Python op only where no native op takes the
        experts (fp8, a GPU, or no build)."""
        return self.experts.graph_op == dispatch.EAGER_MOE

    @property
    def expert_load(self) -> torch.Tensor:
        """Tokens routed to each expert since load: the load the PoP and the simulator read."""
        if self._pending:
            ids = torch.cat([p.reshape(-1) for p in self._pending]).cpu()
            self._load += torch.bincount(ids, minlength=self.num_experts)
            self._pending.clear()
        return self._load

    def routed(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The routed experts' weighted sum, the routing counted in the expert load."""
        self._pending.append(ids)
        if len(self._pending) >= 256:
            self.expert_load  # noqa: B018 - folds the pending ids into the counts
        return self.experts(x, weights, ids)

    def __call__(self, x: torch.Tensor, batch=None) -> torch.Tensor:
        """`batch`: the step's; a compiled step's names its real rows (padding rows are not routed)."""
        weights, ids = self.router(x)
        op = self.experts.op  # kernels.dispatch.experts_op's choice
        if op == dispatch.NATIVE_MOE:  # one C++ op, eager or inside a compiled graph
            out = self.experts.run_native(x, weights, ids, self._load, getattr(batch, "real_rows", None))
        else:
            if eager_ops.in_compiled_step():
                op = self.experts.graph_op
            if op == dispatch.EAGER_MOE:
                out = eager_ops.routed_experts(x, weights, ids, self.handle)
            else:
                out = self.routed(x, weights, ids)
        if self.shared is not None:
            out = out + self.shared(x)
        return out


def moe_tensors(prefix: str, c: ModelConfig) -> dict[str, tuple[int, ...]]:
    h, i = c.hidden_size, c.moe_intermediate_size
    specs: dict[str, tuple[int, ...]] = {
        f"{prefix}.gate.weight": (c.n_routed_experts, h),
        f"{prefix}.gate.e_score_correction_bias": (c.n_routed_experts,),
    }
    for e in range(c.n_routed_experts):
        specs.update(mlp_tensors(f"{prefix}.experts.{e}", h, i))
    if c.n_shared_experts:
        specs.update(mlp_tensors(f"{prefix}.shared_experts", h, i * c.n_shared_experts))
    return specs
