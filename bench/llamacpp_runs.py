"""llama.cpp's tools run on a GGUF, and their printed results read back.

The readers take the tools' own output text (tests/fixtures/llamacpp/ holds samples from real runs):
llama-bench's `-o json`, llama-batched-bench's markdown table, llama-perplexity's final estimate,
llama-simple's completion and llama-lookup's (n-gram speculation) decode speed and acceptance.
"""

from __future__ import annotations

import json
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BenchResult:
    """One llama-bench test: pp (n_prompt > 0) or tg (n_gen > 0), at a depth, mean tok/s."""

    n_prompt: int
    n_gen: int
    n_depth: int
    tok_s: float
    samples: tuple[float, ...]


@dataclass(frozen=True)
class BatchedRow:
    """One row of llama-batched-bench: `sequences` prompts of `pp` tokens, `tg` generated each."""

    pp: int
    tg: int
    sequences: int
    prefill_s: float
    decode_s: float
    total_s: float

    @property
    def generated_tok_s(self) -> float:
        """Generated tokens per second over the whole run, prompt processing included."""
        return self.sequences * self.tg / self.total_s


@dataclass(frozen=True)
class Perplexity:
    value: float
    error: float
    chunks: int
    context: int


def parse_bench_json(text: str) -> list[BenchResult]:
    """llama-bench -o json: a JSON array of tests, from the first line that opens it (log lines before
    it, which may hold brackets of their own, are skipped)."""
    lines = text.splitlines(keepends=True)
    opening = next(i for i, line in enumerate(lines) if line.strip() == "[")
    text = "".join(lines[opening:])
    return [
        BenchResult(
            int(t["n_prompt"]),
            int(t["n_gen"]),
            int(t.get("n_depth", 0)),
            float(t["avg_ts"]),
            tuple(float(s) for s in t.get("samples_ts", [])),
        )
        for t in json.loads(text[: text.rindex("]") + 1])
    ]


def parse_batched_table(text: str) -> list[BatchedRow]:
    """llama-batched-bench's markdown table: | PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | ..."""
    header: list[str] | None = None
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if not cells or set(cells[0]) <= {"-"}:
            continue
        if header is None:
            header = cells
            continue
        got = dict(zip(header, cells, strict=True))
        rows.append(
            BatchedRow(
                int(got["PP"]),
                int(got["TG"]),
                int(got["B"]),
                float(got["T_PP s"]),
                float(got["T_TG s"]),
                float(got["T s"]),
            )
        )
    if header is None:
        raise ValueError("no llama-batched-bench table in the output")
    return rows


@dataclass(frozen=True)
class LookupResult:
    """One llama-lookup run: `decoded` tokens after the prompt (its encoding not timed), drafted
    n-gram tokens and how many the target kept."""

    decoded: int
    decode_s: float
    drafted: int
    accepted: int

    @property
    def tok_s(self) -> float:
        return self.decoded / self.decode_s


_DECODED = re.compile(r"decoded\s+(\d+) tokens in\s+([0-9.]+) seconds")
_LOOKUP_COUNT = re.compile(r"\b(n_drafted|n_accept)\s*=\s*(\d+)")


def parse_lookup(text: str) -> LookupResult:
    """llama-lookup's closing statistics: `decoded N tokens in T seconds`, `n_drafted`, `n_accept`."""
    decoded, counts = _DECODED.search(text), dict(_LOOKUP_COUNT.findall(text))
    if decoded is None or set(counts) != {"n_drafted", "n_accept"}:
        raise ValueError("no decode statistics in llama-lookup's output")
    return LookupResult(int(decoded[1]), float(decoded[2]), int(counts["n_drafted"]), int(counts["n_accept"]))


_FINAL = re.compile(r"Final estimate: PPL = ([0-9.]+) \+/- ([0-9.]+)")
_CHUNKS = re.compile(r"calculating perplexity over (\d+) chunks, n_ctx=(\d+)")


def parse_perplexity(text: str) -> Perplexity:
    final, chunks = _FINAL.search(text), _CHUNKS.search(text)
    if final is None or chunks is None:
        raise ValueError("no final perplexity estimate in llama-perplexity's output")
    return Perplexity(float(final[1]), float(final[2]), int(chunks[1]), int(chunks[2]))


def completion_of(stdout: str, prompt: str) -> str:
    """llama-simple prints the prompt's tokens, then the completion, then a newline."""
    if not stdout.startswith(prompt):
        raise ValueError("llama-simple's output does not start with the prompt (its tokenization differs)")
    return stdout[len(prompt) :].removesuffix("\n")


def _run(argv: list, stdout_only: bool = False) -> str:
    """A tool's output: its results on stdout, its log (where llama-perplexity says how many chunks
    it scored) on stderr."""
    done = subprocess.run([str(a) for a in argv], capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{Path(argv[0]).name} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return done.stdout if stdout_only else done.stdout + done.stderr


class LlamaTools:
    """The tools of one build, on one GGUF, with a fixed thread count."""

    def __init__(self, bin_dir: Path, gguf: Path, threads: int):
        self.bin, self.gguf, self.threads = bin_dir, gguf, threads

    def bench(self, prompt: int, gen: int, depth: int, repetitions: int) -> BenchResult:
        argv = [self.bin / "llama-bench", "-m", self.gguf, "-p", prompt, "-n", gen, "-d", depth]
        argv += ["-t", self.threads, "-r", repetitions, "-o", "json"]
        (result,) = parse_bench_json(_run(argv, stdout_only=True))
        return result

    def batched(self, pp: int, tg: int, sequences: list[int]) -> list[BatchedRow]:
        context = max(sequences) * (pp + tg)
        argv = [self.bin / "llama-batched-bench", "-m", self.gguf, "-c", context, "-b", 2048]
        argv += ["-npp", pp, "-ntg", tg, "-npl", ",".join(map(str, sequences)), "-t", self.threads]
        return parse_batched_table(_run(argv))

    def perplexity(self, text: Path, context: int, kv: str, chunks: int | None) -> Perplexity:
        """`kv` is the cache type of keys and values (f16, q8_0, q4_0); flash attention is on in all,
        as a quantized V cache needs it, so the baseline runs the same attention."""
        argv = [self.bin / "llama-perplexity", "-m", self.gguf, "-f", text, "--no-escape"]
        argv += ["-c", context, "-ctk", kv, "-ctv", kv, "-fa", "on", "-t", self.threads]
        if chunks:
            argv += ["--chunks", chunks]
        return parse_perplexity(_run(argv))

    def lookup(self, prompt: str, tokens: int, draft: int) -> LookupResult:
        """Greedy decode of `tokens` tokens with prompt-lookup (n-gram) drafts of up to `draft`
        tokens from the prompt and the output so far; `draft` 0 decodes one token a step through
        the same loop and timer (the baseline)."""
        argv = [self.bin / "llama-lookup", "-m", self.gguf, "-p", prompt, "-n", tokens, "--temp", 0]
        argv += ["--ignore-eos", "--spec-draft-n-max", draft, "-t", self.threads]
        for _ in range(2):  # its log thread sometimes loses the closing lines at exit: run again
            try:
                return parse_lookup(_run(argv))
            except ValueError:
                pass
        return parse_lookup(_run(argv))

    def greedy(self, prompt: str, tokens: int) -> str:
        argv = [self.bin / "llama-simple", "-m", self.gguf, "-n", tokens, prompt]
        return completion_of(_run(argv, stdout_only=True), prompt)
