"""The routed experts' CPU path (engine.models.layers.RoutedExperts: pairs sorted by expert, one
gather, one weighting, one index_add_) against kernels.moe.fused_moe_ref, fresh inputs each run,
for dense and compressed expert weights, from one token (the unsorted path) to a full batch."""

import pytest
import torch

from engine.models.layers import RoutedExperts
from kernels.moe import fused_moe_ref
from kernels.quant import quantize

SEED = torch.seed() % 2**31


@pytest.mark.parametrize("fmt", ["dense", "int8", "int4", "fp8"])
@pytest.mark.parametrize("tokens, skew", [(1, False), (2, False), (5, False), (32, False), (9, True)])
def test_cpu_path_matches_the_reference(fmt, tokens, skew):
    gen = torch.Generator().manual_seed(SEED + tokens)
    e, h, i, k = 8, 64, 32, 2
    g, u, d = (torch.randn(e, *shape, generator=gen) for shape in ((i, h), (i, h), (h, i)))
    if fmt != "dense":
        g, u, d = quantize(g, fmt), quantize(u, fmt), quantize(d, fmt)
    t = {}
    for expert in range(e):
        for name, w in (("gate_proj", g), ("up_proj", u), ("down_proj", d)):
            t[f"x.{expert}.{name}.weight"] = w[expert]
    experts = RoutedExperts(t, "x", e)
    x = torch.randn(tokens, h, generator=gen)
    ids = torch.stack([torch.randperm(e, generator=gen)[:k] for _ in range(tokens)])
    if skew:
        ids[:, 0] = 5  # one expert takes every token
    weights = torch.rand(tokens, k, generator=gen)
    want = fused_moe_ref(x, weights, ids, g, u, d)
    got = experts(x, weights, ids)
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() < 1e-5 * max(scale, 1.0), f"seed {SEED}"
