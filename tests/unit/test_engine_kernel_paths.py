"""The engine through Triton kernels (interpreted) gives the same tokens as through the torch
references: the dispatch point is the only thing that changes."""

import pytest

from engine import LLM, SamplingParams

pytest.importorskip("triton")


@pytest.mark.parametrize("weights, kv", [("int4", "int4"), ("fp8", "fp8")])
def test_triton_and_torch_paths_agree(tiny_model_dir, monkeypatch, weights, kv):
    params = SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)
    runs = {}
    for backend in ("torch", "triton"):
        monkeypatch.setenv("EDGE_KERNELS", backend)
        llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True, weights=weights, kv_cache_dtype=kv)
        prompts = [llm.encode("def f(x):"), llm.encode("import os, sys")]
        ids = [llm.engine.add_request(p, params) for p in prompts]
        out = {r: [] for r in ids}
        logits = []
        real = llm.model.logits

        def record(hidden, real=real, logits=logits):
            result = real(hidden)
            logits.append(result)
            return result

        llm.model.logits = record
        while llm.engine.has_unfinished():
            for e in llm.engine.step():
                out[e.request_id].append(e.token_id)
        runs[backend] = ([out[r] for r in ids], logits)
    (torch_tokens, torch_logits), (triton_tokens, triton_logits) = runs["torch"], runs["triton"]
    assert triton_tokens == torch_tokens
    for a, b in zip(torch_logits, triton_logits, strict=True):
        assert (a - b).abs().max() < 1e-3 * a.abs().max()
