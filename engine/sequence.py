"""A request inside the engine: its tokens, cache handle, sampler, text and timing."""

from __future__ import annotations

import time

from engine.kv.block_pool import SeqBlocks
from engine.outputs import RequestMetrics
from engine.sampling import Sampler, SamplingParams
from engine.sched.policy import SeqStatus
from engine.speculation import AcceptanceBackoff, MTPDraft, NgramDrafter
from engine.structured.guided import GuideState
from engine.tokenizer import IncrementalDetokenizer


class Sequence:
    def __init__(
        self,
        request_id: str,
        prompt_ids: list[int],
        params: SamplingParams,
        sampler: Sampler,
        kv: SeqBlocks,
        detok: IncrementalDetokenizer | None,
        eos_ids: frozenset[int],
        tenant: str = "local",
        index: int = 0,
        guide: GuideState | None = None,
    ):
        self.request_id = request_id
        self.index = index  # which of the request's n sequences (0: the one that prefills first)
        self.guide = guide  # its grammar's matcher, fed every token it samples
        self.forked = params.n == 1 or index > 0  # index 0 of n > 1: not until its prompt is computed
        self.salt: bytes | None = None  # its prefix-cache salt (the request's n sequences share it)
        self.prompt_ids = list(prompt_ids)
        self.output_ids: list[int] = []
        self.token_ids = list(prompt_ids)  # prompt then output, one growing list (the prefix cache hashes it)
        self.params = params
        self.sampler = sampler
        self.kv = kv
        self.detok = detok
        self.eos_ids = frozenset() if params.ignore_eos else eos_ids | frozenset(params.stop_token_ids)
        self.tenant = tenant
        # within its tenant: lower is admitted first (engine.sched.fair_queue)
        self.priority = params.priority
        self.status = SeqStatus.WAITING
        self.num_computed = 0  # tokens whose KV is in the cache
        self.preemptions = 0
        self.admissions = 0  # times the policy admitted it (one more than its preemptions once running)
        self.cached_tokens = 0  # what the prefix cache held of it at its first admission
        self.order = 0  # arrival order at the scheduling policy (set when it is added)
        # its n-gram index or latest MTP draft, once it speculates
        self.drafter: NgramDrafter | MTPDraft | None = None
        self.backoff: AcceptanceBackoff | None = None  # pauses its drafts while few are accepted
        self.draft_tokens = 0
        self.accepted_tokens = 0
        self.finish_reason: str | None = None
        self.error: str | None = None
        self.arrival = time.perf_counter()
        self.first_scheduled: float | None = None
        self.first_token: float | None = None
        self.finished_at: float | None = None
        # decoded output not yet shown: a tail that may still grow into a stop string, plus the new
        # text of this token. Shown text can hold no part of a stop string, so matching a token
        # looks at this alone: O(new text + longest stop), however long the output grows.
        self._held = ""

    @property
    def tokens(self) -> list[int]:
        """Prompt then output: the live list (read it, do not change it)."""
        return self.token_ids

    @property
    def remaining(self) -> int:
        """Tokens to run through the model before the next one can be sampled."""
        return len(self.prompt_ids) + len(self.output_ids) - self.num_computed

    def append(self, token: int, consumed: bool = False) -> str:
        """Record a sampled token; returns the text that may now be shown (stop strings withheld).
        `consumed`: the guide took the token already (a draft checked against it,
        engine.structured.guided)."""
        now = time.perf_counter()
        if self.first_token is None:
            self.first_token = now
        if self.guide is not None and not consumed and (error := self.guide.consume(token)) is not None:
            self.finish("error", error)  # (not recorded: the grammar refused it)
            return ""
        self.output_ids.append(token)
        self.token_ids.append(token)
        self.sampler.observe(token)
        if token in self.eos_ids:
            self.finish("stop")
            return self._release(final=True, flush=False)
        if self.detok is not None:
            self._held += self.detok.push(token)
        if self.guide is not None and self.guide.complete:
            # the grammar is complete: nothing but the end may follow ("length" when the budget
            # closed it: the answer is whole JSON, but the model did not end it there)
            self.finish("length" if self.guide.closed_by_budget else "stop")
        elif len(self.output_ids) >= self.params.max_tokens:
            self.finish("length")
        final = self.status == SeqStatus.FINISHED
        return self._release(final=final, flush=final)

    def _release(self, final: bool, flush: bool) -> str:
        if flush and self.detok is not None:
            self._held += self.detok.flush()
        text, stops = self._held, self.params.stop
        if stops:
            hits = [i for i in (text.find(s) for s in stops) if i >= 0]
            if hits:
                text = text[: min(hits)]
                self.finish("stop")  # a stop string ends the request even on its last allowed token
                final = True
        hold = 0 if final or not stops else _stop_prefix_tail(text, stops)
        self._held = text[len(text) - hold :] if hold else ""
        return text[: len(text) - hold]

    def finish(self, reason: str, error: str | None = None) -> None:
        self.status = SeqStatus.FINISHED
        self.finish_reason = reason
        self.error = error
        self.finished_at = time.perf_counter()

    def metrics(self) -> RequestMetrics:
        end = self.finished_at or time.perf_counter()
        scheduled = self.first_scheduled or end
        first = self.first_token or end
        n = len(self.output_ids)
        return RequestMetrics(
            prompt_tokens=len(self.prompt_ids),
            completion_tokens=n,
            queue_ms=(scheduled - self.arrival) * 1000,
            prefill_ms=(first - scheduled) * 1000,
            decode_ms=(end - first) * 1000,
            ttft_ms=(first - self.arrival) * 1000,
            tpot_ms=(end - first) * 1000 / (n - 1) if n > 1 else 0.0,
            finish_reason=self.finish_reason,
            preemptions=self.preemptions,
            cached_tokens=self.cached_tokens,
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
        )


def _stop_prefix_tail(text: str, stops: list[str]) -> int:
    """The length of the longest tail of `text` that is a proper prefix of a stop string (held back:
    the next token may complete it). Only starts within the last len(stop) - 1 characters that
    match the stop's first character are tried."""
    n, hold = len(text), 0
    for stop in stops:
        i = text.find(stop[0], max(0, n - len(stop) + 1))
        while i != -1 and n - i > hold:  # earliest start first: the longest tail
            if stop.startswith(text[i:]):
                hold = n - i
                break
            i = text.find(stop[0], i + 1)
    return hold
