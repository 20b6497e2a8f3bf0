"""LLMEngine: requests in, token events out, one `step()` at a time (synchronous, single thread).

The executor half of serving: a step asks the scheduling policy (engine.sched.policy, shared with the
capacity simulator) what to run, runs one forward pass over the flat token batch (decodes
batched together, prefill chunks alongside), samples where a sequence has consumed all its known
tokens, and reports per-request events and per-step statistics.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import time
from collections import deque
from dataclasses import dataclass

import msgspec
import torch

from engine.errors import InvalidRequestError, RequestTooLargeError
from engine.kv.batch import SeqSlice
from engine.kv.kv_cache import BLOCK_SIZE, PagedKVCache
from engine.kv.prefix_hash import new_salt_key, tenant_salt
from engine.logprobs import TokenSpeller, attach_logprobs
from engine.outputs import SeqEvent
from engine.sampling import Sampler, SamplingError, SamplingParams, apply_logit_bias, choice_seed
from engine.sched.fair_queue import TenantShare
from engine.sched.policy import SchedulerConfig, SchedulingPolicy
from engine.sequence import SeqStatus, Sequence
from engine.speculation import AcceptanceBackoff, NgramDrafter, SpeculativeConfig, accepted_prefix
from engine.step.compiled_step import CompiledDecode
from engine.step.mtp_drafts import MTPDrafter, MTPRows, draft_room
from engine.step.runner import ModelRunner, StepOutput
from engine.structured.guided import (
    GuideBatch,
    GuideCompiler,
    GuidedDraft,
    GuideState,
    mask_logits,
    overlap_masks,
)
from engine.tokenizer import IncrementalDetokenizer, TextTokenizer

log = logging.getLogger(__name__)


class StepStats(msgspec.Struct):
    batch_size: int
    prefill_tokens: int
    decode_tokens: int
    kv_blocks_used: int
    kv_blocks_free: int
    duration_ms: float
    preempted: int
    started: float = 0.0  # time.perf_counter() at the step's start (gaps between steps = idle)
    prefill_pairs: float = 0.0  # query-key pairs the prefill chunks' attention covers
    decode_context: int = 0  # tokens the decoders attend to, their new ones included
    draft_tokens: int = 0  # speculative draft tokens verified in this step
    accepted_tokens: int = 0  # of those, the ones the model agreed with (kept)
    # where the step's time went (ms): the policy's plan; the runner's inputs (drafts, grammar masks
    # started); the forward pass (the MTP layer's too); logits and token choices; events (detokenizing,
    # stop strings, forks). duration_ms - forward_ms is what runs in Python between two forwards.
    schedule_ms: float = 0.0
    prepare_ms: float = 0.0
    forward_ms: float = 0.0
    sample_ms: float = 0.0
    emit_ms: float = 0.0
    forward_path: str = ""  # engine.step.runner: "eager", "compiled" or "greedy-graph"


@dataclass
class Choices:
    """The sampling rows' picks: a token each, or the message that ends that row's sequence; and
    the raw log-probabilities of the rows that ask for logprobs (`asking`), before any bias or mask."""

    picks: list[int | str]
    asking: list[int]
    raw: torch.Tensor | None


class AccountStats(msgspec.Struct):
    """One account (tenant) at an engine now: what it holds, what waits, what it lost."""

    running: int  # decode seats held (running sequences)
    kv_blocks: int  # KV blocks its sequences hold (running, and paused ones waiting)
    waiting: int
    preemptions: int  # its sequences preempted since start (for lack of blocks or another's share)


class EngineStats(msgspec.Struct):
    """What the engine is doing now: its queue, its KV cache, its totals since start."""

    running: int
    waiting: int
    kv_blocks_total: int
    kv_blocks_used: int
    kv_blocks_free: int
    kv_bytes_per_token: float
    preemptions: int  # pauses included
    prompt_tokens: int
    generated_tokens: int
    seat_limit: int = 0  # running sequences at most (the policy's sequence cap)
    last_step_ms: float = 0.0  # the latest step's duration (0 before any)
    prefix_cache_queries: int = 0  # tokens of admitted sequences looked up in the prefix cache
    prefix_cache_hits: int = 0  # of those, tokens found there (not run again)
    accounts: dict[str, AccountStats] = {}  # by tenant (the one source of the per-account metrics)
    draft_tokens: int = 0  # speculative draft tokens verified since start
    accepted_tokens: int = 0  # of those, kept
    pauses: int = 0  # of the preemptions, sequences paused with their KV blocks kept (not recomputed)
    compiled_steps: int = 0  # decode steps run as a compiled graph (engine.step.compiled_step)
    compiled_buckets: list[int] = []  # its batch buckets compiled so far (rows)


class LLMEngine:
    def __init__(
        self,
        model,
        cache: PagedKVCache,
        tokenizer: TextTokenizer | None,
        eos_ids: frozenset[int],
        context_window: int,
        vocab_size: int,
        scheduler: SchedulerConfig | None = None,
        prefix_caching: bool = True,
        speculative: SpeculativeConfig | None = None,
        compiled: bool = False,
    ):
        """`speculative`: n-gram or MTP drafts verified in the decode step (engine.speculation,
        engine.step.mtp_drafts; MTP needs `model.mtp`), for every sequence (greedy or sampled, penalties,
        biases, logprobs and grammars included: a guided draft is checked against its mask); None
        decodes one token a step.
        `compiled`: decode-only steps run as a compiled graph (engine.step.compiled_step) once their
        batch bucket is compiled; `compiled_decode.warm_up()` compiles them."""
        self.model = model
        self.cache = cache
        self.tokenizer = tokenizer
        self.eos_ids = eos_ids
        self.context_window = context_window
        self.vocab_size = vocab_size
        self.scheduler = SchedulingPolicy(cache.pool, scheduler or SchedulerConfig())  # it counts blocks only
        self.device = cache.device
        self._ids = itertools.count()
        self._seqs: dict[str, list[Sequence]] = {}  # by request: its live sequences (n of them at most)
        self._guides: GuideCompiler | None = None  # built at the first guide or logprobs request
        self._speller: TokenSpeller | None = None
        self.steps: deque[StepStats] = deque(maxlen=1024)
        self.total_prompt_tokens = 0
        self.total_generated_tokens = 0
        # the prefix cache: salts are keyed by a secret of this process (engine.kv.prefix_hash)
        self.prefix_caching = prefix_caching
        self._salt_key = new_salt_key()
        self.prefix_cache_queries = 0
        self.prefix_cache_hits = 0
        self.speculative = speculative
        self.draft_tokens = 0
        self.accepted_tokens = 0
        mtp = speculative is not None and speculative.method == "mtp"
        if mtp and getattr(model, "mtp", None) is None:
            raise ValueError("speculative method 'mtp' needs the model loaded with its MTP layer")
        self.compiled_decode = CompiledDecode(model, cache, self.device, mtp=mtp) if compiled else None
        self.mtp_drafter: MTPDrafter | None = None
        if mtp:
            assert speculative is not None
            self.mtp_drafter = MTPDrafter(
                model.mtp, cache, self.device, speculative.num_tokens, self.compiled_decode
            )
        drafts_per_step = self.mtp_drafter.num_tokens if self.mtp_drafter is not None else 0
        self.runner = ModelRunner(model, cache, self.compiled_decode, drafts_per_step)

    # --- requests -------------------------------------------------------------------------------

    def check_request(self, prompt_ids: list[int], params: SamplingParams) -> None:
        """Raises InvalidRequestError naming the parameter; call before queueing any work."""
        params.validate()
        params.check_vocab(self.vocab_size)
        if not prompt_ids:
            raise InvalidRequestError("prompt", "must not be empty")
        window = self.context_window
        if len(prompt_ids) >= window:
            raise RequestTooLargeError(
                "prompt", f"is {len(prompt_ids)} tokens; the context window is {window} tokens"
            )
        if len(prompt_ids) + params.max_tokens > window:
            room = window - len(prompt_ids)
            raise RequestTooLargeError(
                "max_tokens",
                f"{params.max_tokens} does not fit: the prompt takes {len(prompt_ids)} of the "
                f"{window}-token context window; ask for at most {room}",
            )
        blocks = self.cache.blocks_for(len(prompt_ids) + params.max_tokens) + self.cache.staging_blocks
        if blocks > self.cache.num_blocks:
            raise RequestTooLargeError(
                "max_tokens",
                f"prompt plus max_tokens needs {blocks} KV blocks; this engine's cache holds "
                f"{self.cache.num_blocks}; ask for fewer tokens",
            )
        if params.guide is not None:
            self._compile(params.guide)  # compiled once here; the sequences copy the cached matcher

    def guide_compiler(self) -> GuideCompiler:
        """This engine's llguidance tokenizer and compiled-grammar cache (built at first use)."""
        if self._guides is None:
            if self.tokenizer is None:
                raise InvalidRequestError("response_format", "this model has no tokenizer.json to guide")
            # the tokenizers library's own JSON of the model's tokenizer.json
            tokenizer_json = self.tokenizer._tok.to_str()  # noqa: SLF001
            self._guides = GuideCompiler(
                tokenizer_json, sorted(self.eos_ids), self.vocab_size, encode=self.tokenizer.encode
            )
        return self._guides

    def _compile(self, guide, max_tokens: int | None = None) -> GuideState:
        """A sequence's guide state; a JSON guide's (any JSON, or a schema's) also closes the object
        within max_tokens, and a tool-call guide's its calls."""
        compiler = self.guide_compiler()
        if max_tokens is None:
            return GuideState(compiler.compile(guide))
        if guide.kind == "json" or guide.calls is not None:
            return GuideState(compiler.compile(guide), compiler, max_tokens, guide.calls)
        if guide.kind == "json_schema":
            return GuideState(compiler.compile(guide), compiler, max_tokens, schema=guide.schema)
        return GuideState(compiler.compile(guide))

    def speller(self) -> TokenSpeller:
        if self._speller is None:
            if self.tokenizer is None:
                self._speller = TokenSpeller(lambda token: f"<{token}>".encode())
            else:
                self._speller = TokenSpeller(self.guide_compiler().token_bytes)
        return self._speller

    def add_request(
        self,
        prompt_ids: list[int],
        params: SamplingParams,
        request_id: str | None = None,
        tenant: str = "local",
        arrival: float | None = None,
        share: TenantShare | None = None,
    ) -> str:
        """Queue a request; `arrival` (time.perf_counter()) is when it reached this engine's host,
        if earlier than now (it waited for the step in progress): its queue time starts there.
        `share`: the tenant's fair-share weight and KV share (engine.sched.fair_queue), as of now."""
        self.check_request(prompt_ids, params)
        if share is not None:
            self.scheduler.configure_tenant(tenant, share.weight, share.kv_share)
        request_id = request_id or f"req-{next(self._ids)}"
        if request_id in self._seqs:
            raise InvalidRequestError("request_id", f"{request_id!r} is already running")
        if self.prefix_caching:  # the tenant is the authenticated account's, never the client's word
            salt = tenant_salt(self._salt_key, tenant)
        else:  # n > 1 still shares the prompt's blocks, under a salt no other request can match
            salt = os.urandom(16) if params.n > 1 else None
        seq = self._new_sequence(request_id, prompt_ids, params, tenant, salt, 0)
        if arrival is not None:
            seq.arrival = min(seq.arrival, arrival)
        self._seqs[request_id] = [seq]
        self.scheduler.add(seq)
        return request_id

    def _new_sequence(
        self, request_id: str, prompt_ids: list[int], params: SamplingParams, tenant: str, salt, index: int
    ) -> Sequence:
        sampler = Sampler(params, self.vocab_size, prompt_ids, self.device)
        detok = IncrementalDetokenizer(self.tokenizer) if self.tokenizer is not None else None
        guide = self._compile(params.guide, params.max_tokens) if params.guide is not None else None
        kv = self.cache.new_sequence()
        seq = Sequence(request_id, prompt_ids, params, sampler, kv, detok, self.eos_ids, tenant, index, guide)
        seq.salt = salt
        if salt is not None:
            self.cache.pool.track(seq.kv, seq.tokens, salt)
        return seq

    def _fork(self, parent: Sequence) -> None:
        """The parent's prompt is computed (its full blocks registered in the prefix cache): the
        request's other n - 1 sequences join, attaching those blocks at admission. Each runs only the
        prompt's partial last block again (1-16 tokens), and samples with its own seed (s + i)."""
        parent.forked = True
        p = parent.params
        for index in range(1, p.n):
            params = msgspec.structs.replace(p, seed=choice_seed(p.seed, index))
            child = self._new_sequence(
                parent.request_id, parent.prompt_ids, params, parent.tenant, parent.salt, index
            )
            child.arrival = parent.arrival
            self._seqs[parent.request_id].append(child)
            self.scheduler.add(child)

    def sequences(self, request_id: str) -> list[Sequence]:
        """A request's live sequences (index 0 first; n > 1 adds the others once its prompt is computed)."""
        return list(self._seqs.get(request_id, ()))

    def abort(self, request_id: str) -> SeqEvent | None:
        """Cancel a request (its client went away); its blocks are freed at once. The first of
        abort_all's events (a request with n > 1 ends each of its sequences: use abort_all)."""
        events = self.abort_all(request_id)
        return events[0] if events else None

    def abort_all(self, request_id: str) -> list[SeqEvent]:
        """Cancel every sequence of a request, one abort event per index (those not yet forked too)."""
        seqs = self._seqs.pop(request_id, None)
        if not seqs:
            return []
        events = []
        for seq in seqs:
            seq.finish("abort")
            self.scheduler.finish(seq)
            events.append(SeqEvent(request_id, None, "", "abort", metrics=seq.metrics(), index=seq.index))
        parent = seqs[0]
        if not parent.forked:
            for index in range(1, parent.params.n):
                metrics = msgspec.structs.replace(parent.metrics(), completion_tokens=0, cached_tokens=0)
                events.append(SeqEvent(request_id, None, "", "abort", metrics=metrics, index=index))
        return events

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # --- one step -------------------------------------------------------------------------------

    @torch.inference_mode()
    def step(self) -> list[SeqEvent]:
        """One step: the policy's plan, the runner's forward, sampling, events; each phase timed
        (StepStats: schedule, prepare, forward, sample, emit)."""
        started = time.perf_counter()
        preempted_before = self.scheduler.preemptions
        policy_plan = self.scheduler.schedule()
        if not policy_plan:
            return []
        scheduled = time.perf_counter()
        plan = policy_plan.entries()  # decoders first, their num_computed up to date
        chunk_past = [seq.num_computed for seq, _ in policy_plan.chunks]
        for seq, _ in policy_plan.chunks:
            if seq.admissions == seq.preemptions:  # admitted this step: it starts after its cached prefix
                self._admitted(seq)
        drafts, guided_drafts = self._drafts(policy_plan) if self.speculative is not None else ({}, {})
        for seq, _ in plan:
            if seq.first_scheduled is None:
                seq.first_scheduled = scheduled
        inputs = self.runner.prepare(plan, len(policy_plan.chunks), drafts)
        samplers = inputs.samplers
        guided = [row for row, (seq, _) in enumerate(samplers) if seq.guide is not None]
        masks = None
        if guided:
            masks = GuideBatch(self.guide_compiler(), guided, [samplers[row][0].guide for row in guided])
            if overlap_masks(self.device):
                masks.start()  # computed while the forward pass runs (else after it, in apply)
        prepared = time.perf_counter()
        out = self.runner.run(inputs)
        forwarded = time.perf_counter()
        logits = self.runner.logits(out, [sl.stop - 1 for _, sl in samplers]) if samplers else None
        self.scheduler.completed(policy_plan)
        verified = self._verify(inputs.speculated, drafts, guided_drafts, out) if inputs.speculated else []
        pool = self.cache.pool
        for seq, _ in plan:
            seq.num_computed = self.scheduler.computed(seq)
            seq.kv.length = seq.num_computed
            pool.commit(seq.kv, seq.num_computed)  # its full computed blocks enter the prefix cache
        chosen = self._choose_all(samplers, logits, masks) if logits is not None else None
        sampled = time.perf_counter()
        events = self._emit_chosen(samplers, chosen) if chosen is not None else []
        for seq, tokens, raw in verified:
            events.extend(self._emit_all(seq, tokens, raw, guided_drafts.get(seq.order)))
        emitted = time.perf_counter()
        if out.next_drafts is not None:
            self._keep_graph_drafts(plan, inputs.slices, out.next_drafts)
        elif self.mtp_drafter is not None:  # the MTP layer's forward: counted as forward time
            self.mtp_drafter.run(self._mtp_rows(policy_plan, plan, inputs.slices), out.hidden)
        ended = time.perf_counter()
        drafted = sum(len(d) for d in drafts.values())
        accepted = sum(len(tokens) - 1 for _, tokens, _ in verified if not isinstance(tokens, str))
        self.draft_tokens += drafted
        self.accepted_tokens += accepted
        prefill = sum(n for _, n in policy_plan.chunks)  # the decoders' tokens are the rest
        pairs = sum(
            n * (past + (n + 1) / 2) for (_, n), past in zip(policy_plan.chunks, chunk_past, strict=True)
        )
        self.steps.append(
            StepStats(
                batch_size=len(plan),
                prefill_tokens=prefill,
                decode_tokens=len(inputs.ids) - prefill,
                kv_blocks_used=self.cache.used_blocks,
                kv_blocks_free=self.cache.free_blocks,
                duration_ms=(ended - started) * 1000,
                preempted=self.scheduler.preemptions - preempted_before,
                started=started,
                prefill_pairs=pairs,
                decode_context=policy_plan.decode_context,
                draft_tokens=drafted,
                accepted_tokens=accepted,
                schedule_ms=(scheduled - started) * 1000,
                prepare_ms=(prepared - scheduled) * 1000,
                forward_ms=(forwarded - prepared + ended - emitted) * 1000,
                sample_ms=(sampled - forwarded) * 1000,
                emit_ms=(emitted - sampled) * 1000,
                forward_path=out.path,
            )
        )
        self.total_prompt_tokens += prefill
        return events

    def _keep_graph_drafts(self, plan, slices: list[SeqSlice], drafts: torch.Tensor) -> None:
        """Each live sequence's next draft from the greedy graph: the MTP layer's output at its
        last kept row (the one whose next token is the newest)."""
        picks = []
        for (seq, _), sl in zip(plan, slices, strict=True):
            if seq.status != SeqStatus.FINISHED and seq.params.speculative:
                picks.append((seq, sl.start + seq.num_computed - sl.past - 1))
        if picks:
            assert self.mtp_drafter is not None
            for (seq, _), token in zip(picks, drafts[[row for _, row in picks]].tolist(), strict=True):
                self.mtp_drafter.keep(seq, [token])

    def _mtp_rows(self, policy_plan, plan, slices: list[SeqSlice]) -> list[MTPRows]:
        """The rows of this step the MTP layer runs: every computed position whose next token is
        known, of the live sequences that may speculate. Past `max_decoders` decoders the decode
        rows are skipped (no draft would be verified; the layer's cache then has gaps there,
        which lowers later drafts' acceptance but never changes an output)."""
        config = self.speculative
        assert config is not None
        decoding = len(policy_plan.decoders()) <= config.max_decoders
        chunks = {seq.order for seq, _ in policy_plan.chunks}
        rows = []
        for (seq, _), sl in zip(plan, slices, strict=True):
            p = seq.params
            if seq.status == SeqStatus.FINISHED or not p.speculative:
                continue
            if not decoding and seq.order not in chunks:
                continue
            count = min(seq.num_computed, len(seq.tokens) - 1) - sl.past
            if count > 0:
                rows.append(MTPRows(seq, sl.past, sl.start, count))
        return rows

    def _drafts(self, plan) -> tuple[dict[int, list[int]], dict[int, GuidedDraft]]:
        """N-gram or MTP drafts for this step's decoders that may speculate, by sequence order. A
        draft stays inside the block the real token is written to and never fills its last slot:
        no block is allocated for a guess, and a quantized format's staged block is never sealed
        with a token that may be rejected. A guided sequence's draft is checked against its
        grammar (engine.structured.guided.GuidedDraft: cut at the first token its mask refuses), which also
        gives each of its verify rows the mask a one-token step would apply there."""
        config = self.speculative
        assert config is not None
        decoders = plan.decoders()
        if not decoders or len(decoders) > config.max_decoders:
            return {}, {}
        out: dict[int, list[int]] = {}
        guided: dict[int, GuidedDraft] = {}
        for seq in decoders:
            p = seq.params
            if not seq.forked or not p.speculative:
                continue
            room = draft_room(seq, seq.num_computed)
            if room <= 0:
                continue
            drafter = seq.drafter
            if drafter is None:
                if self.mtp_drafter is not None:  # its first draft comes with its prompt's last row
                    continue
                drafter = seq.drafter = NgramDrafter(config)
            if seq.backoff is None:
                seq.backoff = AcceptanceBackoff(config)
            if seq.backoff is not None and seq.backoff.paused():
                continue
            draft = drafter.propose(seq.tokens, room)
            if draft and seq.guide is not None:
                checked = GuidedDraft(self.guide_compiler(), seq.guide, draft)
                draft = checked.draft
                if draft:
                    guided[seq.order] = checked
            if draft:
                out[seq.order] = draft
        return out, guided

    def _verify(
        self,
        speculated: list,
        drafts: dict[int, list[int]],
        guided: dict[int, GuidedDraft],
        out: StepOutput,
    ) -> list:
        """Each speculating sequence's tokens for this step: the accepted draft tokens, then one of
        the model's own. Greedy rows take the argmax (exactly what decoding one token a step gives);
        the others go through the sequence's sampler (Sampler.verify: speculative rejection
        sampling, the output distribution unchanged). Logit biases apply to every row, as they
        would one step at a time, then a guided sequence's masks (its GuidedDraft's). The accepted
        tokens are computed already, so the policy moves the sequence ahead by that many. Also
        returns each sequence's raw log-probabilities of its rows when it asks for logprobs."""
        rows = [row for _, sl in speculated for row in range(sl.start, sl.stop)]
        logits = self.runner.logits(out, rows)
        finite = torch.isfinite(logits.sum(dim=-1)).tolist()
        asking = [i for i, (seq, _) in enumerate(speculated) if seq.params.logprobs is not None]
        starts = list(itertools.accumulate((sl.length for _, sl in speculated), initial=0))
        raw = {
            i: torch.log_softmax(logits[starts[i] : starts[i + 1]].float(), dim=-1) for i in asking
        }  # before the biases: logprobs are the model's own
        apply_logit_bias(logits, [seq.params.logit_bias for seq, sl in speculated for _ in range(sl.length)])
        for i, (seq, _) in enumerate(speculated):
            if (checked := guided.get(seq.order)) is not None:
                mask_logits(logits, list(range(starts[i], starts[i + 1])), checked.bitmask)
        best = logits.argmax(dim=-1).tolist()
        out = []
        for i, (seq, sl) in enumerate(speculated):
            draft, at = drafts[seq.order], starts[i]
            ok = finite[at : at + sl.length]
            usable = ok.index(False) if False in ok else sl.length  # rows before the first bad one
            p = seq.params
            if usable == 0:
                out.append((seq, "the model produced non-finite logits for this request", None))
                continue
            if p.greedy and not p.penalised:
                n = accepted_prefix(draft, best[at : at + sl.length])
                tokens = [*draft[:n], best[at + n]] if n < usable else draft[:usable]
            else:
                try:
                    tokens = seq.sampler.verify(logits[at : at + usable], draft)
                except SamplingError as exc:  # it alone ends, as in _sample
                    out.append((seq, str(exc), None))
                    continue
            self.scheduler.advance_decoder(seq, len(tokens) - 1)
            seq.draft_tokens += len(draft)
            seq.accepted_tokens += len(tokens) - 1
            if seq.backoff is not None:
                seq.backoff.record(len(draft), len(tokens) - 1)
            out.append((seq, tokens, raw.get(i)))
        return out

    def _emit_all(
        self,
        seq: Sequence,
        tokens: list[int] | str,
        raw: torch.Tensor | None,
        checked: GuidedDraft | None = None,
    ) -> list[SeqEvent]:
        """The events of a speculating sequence's tokens, up to the one that ends it (`tokens`: a
        message instead when it failed); `raw`: its rows' log-probabilities, when it asks for them.
        A guided sequence takes its draft's grammar states: each accepted draft token's was consumed
        already, and its own token is consumed in the state its row was masked by."""
        if isinstance(tokens, str):
            seq.finish("error", tokens)
            return [self._finished(seq, None, "")]
        events = []
        accepted = 0  # the leading tokens that are the draft's (tokens may stop short of a pick)
        while checked is not None and accepted < min(len(checked.draft), len(tokens)):
            if tokens[accepted] != checked.draft[accepted]:
                break
            accepted += 1
        for j, token in enumerate(tokens):
            if checked is not None:
                seq.guide = checked.state_after(j + 1 if j < accepted else j)
            events.append(self._emit(seq, token, consumed=j < accepted))
            if seq.status == SeqStatus.FINISHED:
                break
        if raw is not None:
            attach_logprobs(events, raw[: len(events)], [seq.params.logprobs] * len(events), self.speller())
        return events

    def _admitted(self, seq: Sequence) -> None:
        seq.admissions += 1
        if self.prefix_caching:
            self.prefix_cache_queries += len(seq.tokens)
            self.prefix_cache_hits += seq.num_computed
        if seq.admissions == 1:
            seq.cached_tokens = seq.num_computed

    def _choose_all(self, samplers: list, logits: torch.Tensor, masks: GuideBatch | None) -> Choices:
        """Each sampling row's token, or the message that ends its sequence. Batched: the finiteness
        check, the raw log_softmax of the rows that ask for logprobs (before any mask), the grammar
        masks, the greedy argmax (after them)."""
        finite = torch.isfinite(logits.sum(dim=-1)).tolist()  # any nan/inf in a row poisons its sum
        asking = [row for row, (seq, _) in enumerate(samplers) if seq.params.logprobs is not None]
        raw = torch.log_softmax(logits[asking].float(), dim=-1) if asking else None
        # each row's logit_bias, after `raw` (logprobs stay the model's own) and before the masks
        apply_logit_bias(logits, [seq.params.logit_bias for seq, _ in samplers])
        dead = dict(zip(masks.rows, masks.apply(logits), strict=True)) if masks is not None else {}
        best = logits.argmax(dim=-1).tolist()  # one reduction for every greedy sequence, masks applied
        picks = [
            self._choose(seq, logits, row, finite[row], best[row], dead.get(row))
            for row, (seq, _) in enumerate(samplers)
        ]
        return Choices(picks, asking, raw)

    def _choose(
        self, seq: Sequence, logits: torch.Tensor, row: int, finite: bool, best: int, dead: str | None
    ) -> int | str:
        if not finite:
            return "the model produced non-finite logits for this request"
        if dead is not None:  # its grammar allows no token: it alone ends
            return dead
        p = seq.params
        # a batch is shared by every tenant: whatever goes wrong sampling one row ends that row
        try:
            return best if p.greedy and not p.penalised else seq.sampler(logits[row])
        except SamplingError as exc:
            return str(exc)
        except Exception:
            log.exception("sampling request %s failed; it alone ends", seq.request_id)
            return "sampling failed for this request (internal error; the others went on)"

    def _emit_chosen(self, samplers: list, chosen: Choices) -> list[SeqEvent]:
        """One event per sampling row from _choose_all's picks (a request's first sampled token
        forks its other n - 1 sequences first)."""
        events = []
        for (seq, _), pick in zip(samplers, chosen.picks, strict=True):
            if not seq.forked:
                self._fork(seq)
            if isinstance(pick, str):
                seq.finish("error", pick)
                events.append(self._finished(seq, None, ""))
            else:
                events.append(self._emit(seq, pick))
        if chosen.asking:
            ks = [samplers[row][0].params.logprobs for row in chosen.asking]
            attach_logprobs([events[row] for row in chosen.asking], chosen.raw, ks, self.speller())
        return events

    def _emit(self, seq: Sequence, token: int, consumed: bool = False) -> SeqEvent:
        """Record a chosen token on `seq` and say what it produced (`consumed`: its guide has taken
        the token already, a verified draft's)."""
        try:
            text = seq.append(token, consumed)
        except SamplingError as exc:
            seq.finish("error", str(exc))
            return self._finished(seq, None, "")
        except Exception:
            log.exception("sampling request %s failed; it alone ends", seq.request_id)
            seq.finish("error", "sampling failed for this request (internal error; the others went on)")
            return self._finished(seq, None, "")
        if seq.finish_reason == "error":  # the grammar refused the token
            return self._finished(seq, None, text)
        self.total_generated_tokens += 1
        if seq.status == SeqStatus.FINISHED:
            return self._finished(seq, token, text)
        return SeqEvent(seq.request_id, token, text, index=seq.index)

    def _finished(self, seq: Sequence, token: int | None, text: str) -> SeqEvent:
        self.scheduler.finish(seq)
        live = self._seqs.get(seq.request_id)
        if live is not None and seq in live:
            live.remove(seq)
            if not live and seq.forked:  # (an unforked parent's n - 1 are still to join)
                del self._seqs[seq.request_id]
        return SeqEvent(
            seq.request_id, token, text, seq.finish_reason, seq.error, seq.metrics(), index=seq.index
        )

    # --- introspection ----------------------------------------------------------------------------

    def expert_load(self) -> list[list[int]]:
        """Tokens routed to each expert, per MoE layer, since the engine started."""
        return [layer.expert_load.tolist() for layer in self.model.moe_layers()]

    def stats(self) -> EngineStats:
        sched, cache = self.scheduler, self.cache
        return EngineStats(
            running=len(sched.running),
            waiting=len(sched.waiting),
            kv_blocks_total=cache.num_blocks,
            kv_blocks_used=cache.used_blocks,
            kv_blocks_free=cache.free_blocks,
            kv_bytes_per_token=cache.bytes_per_token(),
            preemptions=sched.preemptions,
            pauses=sched.pauses,
            prompt_tokens=self.total_prompt_tokens,
            generated_tokens=self.total_generated_tokens,
            seat_limit=sched.config.seat_limit,
            last_step_ms=self.steps[-1].duration_ms if self.steps else 0.0,
            prefix_cache_queries=self.prefix_cache_queries,
            prefix_cache_hits=self.prefix_cache_hits,
            accounts={name: AccountStats(*row) for name, row in sched.tenant_stats().items()},
            draft_tokens=self.draft_tokens,
            accepted_tokens=self.accepted_tokens,
            compiled_steps=self.compiled_decode.steps if self.compiled_decode else 0,
            compiled_buckets=sorted(self.compiled_decode.ready) if self.compiled_decode else [],
        )

    def recent_steps(self, n: int) -> list[StepStats]:
        """The last `n` steps' statistics, oldest first."""
        return list(self.steps)[-n:] if n > 0 else []

    def kv_capacity_tokens(self) -> int:
        return self.cache.num_blocks * BLOCK_SIZE


def default_kv_budget(device: torch.device, bytes_per_token: float, context_window: int) -> int:
    """Without an explicit kv_cache_bytes: 90% of free GPU memory, or room for 16 full contexts on CPU."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free * 0.9)
    return int(math.ceil(bytes_per_token * context_window * 16))
