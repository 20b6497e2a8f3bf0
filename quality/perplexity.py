"""What a compression setting costs in accuracy: perplexity and greedy agreement on held-out text.

For each setting (weights x KV dtype) and context length, the held-out text is cut into windows
of that many tokens; each window runs through the model with the KV cache in that dtype (keys and
values read back from the cache, as decoding sees them), and every next-token prediction is scored.
The baseline is the first weights setting with the model's own KV dtype (auto).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import msgspec
import torch

from engine.errors import ModelLoadError
from engine.llm import LLM


class EvalRow(msgspec.Struct):
    weights: str
    kv_cache_dtype: str
    context: int
    windows: int
    tokens_scored: int
    perplexity: float
    ppl_change_pct: float  # against the baseline at the same context
    greedy_agreement: float  # share of positions whose argmax equals the baseline's
    kv_bytes_per_token: float  # all layers, scales included
    seconds: float


def heldout_text_path(model_dir: Path) -> Path:
    for candidate in (model_dir / "heldout.txt", model_dir.parent / "eval" / "heldout.txt"):
        if candidate.is_file():
            return candidate
    raise ModelLoadError(
        f"{model_dir}: no held-out text (heldout.txt beside it or in ../eval/); pass --text FILE"
    )


def _windows(ids: list[int], context: int, limit: int | None) -> list[list[int]]:
    count = len(ids) // context
    if limit:
        count = min(count, limit)
    return [ids[i * context : (i + 1) * context] for i in range(count)]


def evaluate(
    model_dir: str | Path,
    kv_dtypes: list[str],
    contexts: list[int],
    weights: list[str] | None = None,
    text: str | Path | None = None,
    max_windows: int | None = None,
    device: str | None = None,
    trusted_keys: list[str | Path] | None = None,
    allow_unsigned: bool = False,
) -> list[EvalRow]:
    model_dir = Path(model_dir)
    weights = weights or ["auto"]
    text_path = Path(text) if text else heldout_text_path(model_dir)
    rows: list[EvalRow] = []
    baseline: dict[int, tuple[float, list[torch.Tensor]]] = {}
    settings = [(w, kv) for w in weights for kv in kv_dtypes]
    if ("auto" if weights[0] == "auto" else weights[0], "auto") not in settings:
        settings.insert(0, (weights[0], "auto"))  # the baseline is always measured
    for w, kv in settings:
        llm = LLM(
            model_dir,
            weights=w,
            kv_cache_dtype=kv,
            device=device,
            trusted_keys=trusted_keys,
            allow_unsigned=allow_unsigned,
        )
        ids = llm.encode(text_path.read_text(encoding="utf-8"))
        for context in contexts:
            if context > llm.context_window:
                raise ModelLoadError(
                    f"--contexts {context} exceeds the model's {llm.context_window}-token window"
                )
            windows = _windows(ids, context, max_windows)
            if not windows:
                raise ModelLoadError(f"{text_path}: {len(ids)} tokens hold no {context}-token window")
            started = time.perf_counter()
            nll, count, agree, argmaxes = 0.0, 0, 0, []
            for i, window in enumerate(windows):
                logits = llm.logits(window)[:-1]
                target = torch.tensor(window[1:])
                nll += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
                count += len(window) - 1
                top = logits.argmax(-1)
                argmaxes.append(top)
                if context in baseline:
                    agree += int((top == baseline[context][1][i]).sum())
            ppl = math.exp(nll / count)
            if context not in baseline:
                baseline[context] = (ppl, argmaxes)
                agree = count
            rows.append(
                EvalRow(
                    weights=llm.weights_label if w != "auto" else "as stored",
                    kv_cache_dtype=kv,
                    context=context,
                    windows=len(windows),
                    tokens_scored=count,
                    perplexity=ppl,
                    ppl_change_pct=(ppl / baseline[context][0] - 1) * 100,
                    greedy_agreement=agree / count,
                    kv_bytes_per_token=llm.engine.cache.bytes_per_token(),
                    seconds=time.perf_counter() - started,
                )
            )
    return rows


def format_table(rows: list[EvalRow]) -> str:
    header = ["weights", "kv", "context", "windows", "perplexity", "change", "greedy agree", "KV B/token"]
    lines = [header]
    for r in rows:
        lines.append(
            [
                r.weights,
                r.kv_cache_dtype,
                str(r.context),
                str(r.windows),
                f"{r.perplexity:.3f}",
                f"{r.ppl_change_pct:+.2f}%",
                f"{r.greedy_agreement * 100:.2f}%",
                f"{r.kv_bytes_per_token:.1f}",
            ]
        )
    widths = [max(len(line[i]) for line in lines) for i in range(len(header))]
    return "\n".join(
        "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(line, widths, strict=True))
        )
        for line in lines
    )


class CompareRow(msgspec.Struct):
    context: int
    windows: int
    baseline_perplexity: float
    candidate_perplexity: float
    ppl_change_pct: float
    greedy_agreement: float


def _score(llm: LLM, windows: list[list[int]]) -> tuple[float, list[torch.Tensor]]:
    nll, count, argmaxes = 0.0, 0, []
    for window in windows:
        logits = llm.logits(window)[:-1]
        nll += float(torch.nn.functional.cross_entropy(logits, torch.tensor(window[1:]), reduction="sum"))
        count += len(window) - 1
        argmaxes.append(logits.argmax(-1))
    return math.exp(nll / count), argmaxes


def compare(
    candidate: LLM, baseline: LLM, contexts: list[int], text: Path, max_windows: int | None = None
) -> list[CompareRow]:
    """Perplexity of both on the same held-out windows, and how often their greedy picks agree."""
    if candidate.tokenizer.vocab_size != baseline.tokenizer.vocab_size:
        raise ModelLoadError(
            "the candidate and the baseline use different tokenizers; compare like with like"
        )
    ids = baseline.encode(text.read_text(encoding="utf-8"))
    rows = []
    for context in contexts:
        windows = _windows(ids, context, max_windows)
        if not windows:
            raise ModelLoadError(f"{text}: {len(ids)} tokens hold no {context}-token window")
        base_ppl, base_top = _score(baseline, windows)
        cand_ppl, cand_top = _score(candidate, windows)
        agree = sum(int((a == b).sum()) for a, b in zip(cand_top, base_top, strict=True))
        total = sum(len(a) for a in base_top)
        rows.append(
            CompareRow(
                context, len(windows), base_ppl, cand_ppl, (cand_ppl / base_ppl - 1) * 100, agree / total
            )
        )
    return rows
