"""Our engine measured the way llama.cpp's tools measure themselves (bench/engine_vs_llamacpp.py).

- decode at batch 1: the prompt is prefilled untimed (llama-bench's `-d`), then `tokens` decode steps;
- concurrent sequences: every prompt submitted at once to the continuous batcher, generated tokens
  over the whole run, prompt processing included (llama-batched-bench's B * TG / T);
- prefill: one prompt in one step (llama-bench's pp);
- perplexity: llama-perplexity's windows (the first `context` tokens, the next, ...) scored on their
  second half only, each prediction having at least half a window of context.
"""

from __future__ import annotations

import math
import time

import torch


def _params(tokens: int, ignore_eos: bool = True):
    from engine import SamplingParams

    return SamplingParams(max_tokens=tokens, temperature=0, ignore_eos=ignore_eos)


def decode_tok_s(llm, prompt: list[int], tokens: int) -> float:
    """Tokens per second of `tokens` decode steps after the prompt's prefill (which is not timed)."""
    engine = llm.engine
    engine.add_request(prompt, _params(tokens + 1))  # the prefill step emits the first token
    engine.step()
    started = time.perf_counter()
    while engine.has_unfinished():
        engine.step()
    return tokens / (time.perf_counter() - started)


def concurrent_tok_s(llm, prompts: list[list[int]], tokens: int) -> float:
    """Generated tokens per second, all prompts submitted at once, from submission to the last token."""
    engine = llm.engine
    started = time.perf_counter()
    for p in prompts:
        engine.add_request(p, _params(tokens))
    generated = 0
    while engine.has_unfinished():
        generated += sum(e.token_id is not None for e in engine.step())
    seconds = time.perf_counter() - started
    if generated != len(prompts) * tokens:
        raise RuntimeError(f"generated {generated} tokens, expected {len(prompts) * tokens}")
    return generated / seconds


def prefill_tok_s(llm, prompt: list[int]) -> float:
    """Prompt tokens per second of one prefill step (the engine's token budget must hold the prompt)."""
    engine = llm.engine
    engine.add_request(prompt, _params(1))
    started = time.perf_counter()
    events = engine.step()
    seconds = time.perf_counter() - started
    if not any(e.token_id is not None for e in events):
        raise RuntimeError(f"a {len(prompt)}-token prompt took more than one step; raise the token budget")
    while engine.has_unfinished():
        engine.step()
    return len(prompt) / seconds


def greedy(llm, prompt: list[int], tokens: int) -> list[int]:
    """Up to `tokens` greedy tokens, stopping at an end-of-sequence token as llama-simple does."""
    engine = llm.engine
    rid = engine.add_request(prompt, _params(tokens, ignore_eos=False))
    out = []
    while engine.has_unfinished():
        out += [e.token_id for e in engine.step() if e.request_id == rid and e.token_id is not None]
    return out


def windows(ids: list[int], context: int, chunks: int | None = None) -> list[list[int]]:
    """llama-perplexity's chunks: consecutive `context`-token windows from the start, at most `chunks`."""
    count = len(ids) // context
    if chunks:
        count = min(count, chunks)
    return [ids[i * context : (i + 1) * context] for i in range(count)]


def second_half_nll(logits: torch.Tensor, window: list[int]) -> tuple[float, int]:
    """Summed negative log-likelihood of the window's second half and how many tokens that is:
    the logits at positions n/2 .. n-2 predicting tokens n/2+1 .. n-1, as llama-perplexity scores."""
    first = len(window) // 2
    target = torch.tensor(window[first + 1 :])
    scored = logits[first : len(window) - 1].float()
    return float(torch.nn.functional.cross_entropy(scored, target, reduction="sum")), len(target)


def second_half_perplexity(llm, ids: list[int], context: int, chunks: int | None = None) -> float:
    nll, count = 0.0, 0
    for window in windows(ids, context, chunks):
        part, n = second_half_nll(llm.logits(window), window)
        nll, count = nll + part, count + n
    return math.exp(nll / count)
