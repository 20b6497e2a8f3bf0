"""The engine's CPU decode step against its previous eager path: the torch references swapped back
in at each changed op give identical greedy tokens and float32 logits within 1e-4, for both shipped
architectures (MLA kimi, GQA glm) and every KV format, with sequences decoding side by side.

A quantized cache rounds what it stores: a 1e-6 difference in a layer's output can move a stored
value across a rounding step (an int8 step is 1/127 of its head's range), and later logits by
1e-3. So with a quantized cache the first decode step (both paths start from the same prefilled
cache) is held to 1e-4 and the steps after it to 1e-2, far below what a wrong op gives (O(1)).
The inputs are random, drawn from a fixed seed per case so that a near-tie between two greedy
candidates cannot make the test flaky."""

import pytest
import torch

from engine import LLM, SamplingParams
from engine.models import layers
from kernels import native_ops, paged_kv, paged_kv_flat
from kernels.moe import fused_moe_ref
from kernels.rmsnorm import rms_norm_ref
from tests.conftest import REPO


def reference_ops(monkeypatch) -> None:
    """The per-op torch references the decode step ran before its fast paths (the fused C++ ops of
    kernels.native_ops included: the routed experts' and the dense products')."""
    monkeypatch.setattr(layers.RMSNorm, "__call__", lambda self, x: rms_norm_ref(x, self.weight, self.eps))
    monkeypatch.setattr(layers.RoutedExperts, "__call__", experts_ref)
    monkeypatch.setattr(
        layers.RoutedExperts,
        "run_native",
        lambda self, x, weights, ids, load, rows: experts_ref(self, x, weights, ids),
    )
    monkeypatch.setattr(  # (a bf16 matrix kept bf16 on the CPU: widened, as the C kernel does in registers)
        native_ops,
        "linear_dense",
        lambda x, w, bias=None, activations="f32": torch.nn.functional.linear(x, w.to(x.dtype), bias),
    )
    monkeypatch.setattr(
        paged_kv_flat,
        "write",
        lambda store, ix, x: paged_kv.decode_write_ref(store, ix.tables, ix.pos, ix.slots, x),
    )
    monkeypatch.setattr(
        paged_kv_flat,
        "gqa_decode",
        lambda q, k, v, ix, scale: paged_kv.gqa_decode_ref(q, k, v, ix.tables, ix.lengths, ix.slots, scale),
    )
    monkeypatch.setattr(
        paged_kv_flat,
        "mla_decode",
        lambda ql, qr, lat, rope, ix, scale: paged_kv.mla_decode_ref(
            ql, qr, lat, rope, ix.tables, ix.lengths, ix.slots, scale
        ),
    )


def experts_ref(self: layers.RoutedExperts, x, weights, ids):
    if not self.fused:
        return fused_moe_ref(x, weights, ids, self.w_gate, self.w_up, self.w_down)
    i = self.w_gate_up_t.shape[2] // 2
    gate_up = self.w_gate_up_t.transpose(1, 2)
    return fused_moe_ref(x, weights, ids, gate_up[:, :i], gate_up[:, i:], self.w_down_t.transpose(1, 2))


def run(llm: LLM, prompts: list[list[int]], tokens: int) -> tuple[list[list[int]], list[torch.Tensor]]:
    params = SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=True)
    logits: list[torch.Tensor] = []
    real = llm.model.logits

    def record(hidden):
        out = real(hidden)
        logits.append(out)
        return out

    llm.model.logits = record
    try:
        ids = [llm.engine.add_request(p, params) for p in prompts]
        out: dict[str, list[int]] = {r: [] for r in ids}
        while llm.engine.has_unfinished():
            for e in llm.engine.step():
                out[e.request_id].append(e.token_id)
    finally:
        llm.model.logits = real
    return [out[r] for r in ids], logits


KV_DTYPES = ["auto", "fp8", "int8", "int4"]
MODELS = ["kimi-k2-mini", "glm-4.5-mini"]


@pytest.mark.parametrize("kv", KV_DTYPES)
@pytest.mark.parametrize("model", MODELS)
def test_fast_decode_step_matches_the_reference_ops(model, kv, monkeypatch):
    llm = LLM(REPO / "models" / model, device="cpu", kv_cache_dtype=kv, prefix_caching=False)
    seed = 1000 * MODELS.index(model) + KV_DTYPES.index(kv)
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(7, 4000, (n,), generator=gen).tolist() for n in (5, 14, 30)]
    fast_tokens, fast_logits = run(llm, prompts, 12)  # 12 steps: every sequence crosses a block
    with monkeypatch.context() as m:
        reference_ops(m)
        ref_tokens, ref_logits = run(llm, prompts, 12)
    assert fast_tokens == ref_tokens, f"seed {seed}"
    assert len(fast_logits) == len(ref_logits) == 12
    diffs = [(a - b).abs().max().item() for a, b in zip(fast_logits, ref_logits, strict=True)]
    assert diffs[0] < 1e-4 and diffs[1] < 1e-4, f"seed {seed}: {diffs[:2]}"  # prefill, first decode
    bound = 1e-4 if kv == "auto" else 1e-2
    assert max(diffs) < bound, f"seed {seed}: {max(diffs)} (bound {bound})"
