"""Grammar-constrained decoding: a Guide (engine.structured.guide) compiled by llguidance against the engine's
tokenizer, one matcher per sequence, its allowed-token mask applied to that sequence's logits row.

Why llguidance: it is CPU-native (Rust, no GPU kernels needed), takes JSON schema, regex and Lark
alike, and its mask costs are small enough on our vocabulary to hide: measured on the shipped
miniatures' 4096-token vocab (this machine, loaded): building the LLTokenizer ~25 ms (once per
engine), compiling a five-field JSON schema ~1 ms (cached by spec afterwards), one mask
0.04-0.08 ms on average (under 1 ms at worst) per sequence per step.

Masks are computed off the critical path where there is room for it: `GuideBatch.start` fills the
guided rows' bitmask on a worker thread (llguidance releases the GIL, and fans the rows out over its
own thread pool) while the forward pass runs on an accelerator or on cores torch leaves free
(`overlap_masks`); `apply` waits for it (or fills them then) and masks the logits in one batched
gather-and-add. A step with no guided rows builds no GuideBatch and pays nothing.

JSON guides are compiled with compact, fixed separators (", " and ": ", no free whitespace, which a
schema may turn back on with its own "x-guidance" options): free whitespace lets a model wander
into endless newlines, the classic way JSON mode fails to close. JSON mode also closes the
object within max_tokens (GuideState.closing_token, engine.structured.json_close): a sampled answer that
wanders inside a key or down nested brackets gets its closing tokens forced once only they fit; under
a schema that closing is planned against the grammar as a tool call's is (below), so that it also
follows the schema. A schema's integers are held to 15 digits unless it bounds them itself
(engine.structured.guide.bounded_integers).
Tool calls are closed the same way (engine.structured.tool_close): the plan is the matcher's own forced
bytes, the tracker's hint (the JSON arguments' close, the format's end markers) and short
fallbacks where the schema wants more, each checked against the grammar; its tokens are forced
once only they fit (measured: about 0.3 ms a plan, some 30 plans a call). Between calls, another
call may start only while the budget holds a whole one; else the reply's end is forced.
"""

from __future__ import annotations

import copy
import logging
import os
import threading
import warnings
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import msgspec
import torch

# llguidance.torch decorates a function with torch.compile when imported, which imports inductor and
# with it torch.utils.mkldnn, whose 14 torch.jit.script_method uses each warn that the API is
# deprecated: noise in every worker project's pytest run, none of it ours or the user's to act on.
# Only that warning, only during this import (the filter a pytest run sets per test is left alone).
with warnings.catch_warnings():
    warnings.filterwarnings(
        "ignore", message=r"`torch\.jit\.script_method` is deprecated", category=DeprecationWarning
    )
    import llguidance.torch as llg_torch

from engine.errors import InvalidRequestError
from engine.structured.guide import JSON_OPTIONS, CallFormat, Guide, bounded_integers
from engine.structured.guide_tokenizer import guide_tokenizer, marker_tokens
from engine.structured.json_close import JsonCloser, JsonTracker
from engine.structured.tool_calls import resolve_markers
from engine.structured.tool_close import CallTracker

log = logging.getLogger(__name__)
MAX_COMPILED = 128  # compiled grammars kept per engine (least recently used dropped)
SERIAL_ROWS = 4  # up to this many guided rows, one thread fills their masks in turn
DEAD_GRAMMAR = "JSON Mode couldn't be met"  # Cloudflare's wording for a guide that cannot be followed
# a mask byte's 8 bits as what to add to the 8 logits it covers (0 allowed, -inf not), in the bit
# order llguidance writes (token 32*w + b is bit b of int32 word w, little-endian bytes): masking a
# row is one gather and one add, with no branch per token (a bool mask's fill mispredicts on every
# token of a half-allowed row)
_BYTE_BIAS = torch.tensor(
    [[0.0 if (byte >> bit) & 1 else float("-inf") for bit in range(8)] for byte in range(256)]
)
_BIAS_BY_DEVICE: dict[tuple[str, torch.dtype], torch.Tensor] = {}


def _byte_bias(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """_BYTE_BIAS on `device` in `dtype` (copied there once)."""
    key = (str(device), dtype)
    if key not in _BIAS_BY_DEVICE:
        _BIAS_BY_DEVICE[key] = _BYTE_BIAS.to(device, dtype)
    return _BIAS_BY_DEVICE[key]


# any-JSON mode starts forcing the closing tokens when the budget left is within CLOSE_MARGIN of
# their count: room for one free token to open a few more brackets; CLOSE_SLACK bounds the closing
# text's bytes beyond the open brackets (`"": 0` and an escape's rest), so most steps skip the check
CLOSE_MARGIN = 4
CLOSE_SLACK = 16
# a tool call's closing (engine.structured.tool_close), and a JSON schema's, is forced once the budget
# left is within CALL_MARGIN of its length (one token may open a key, an escape, a bracket); a closing
# longer than MAX_PLAN tokens is not planned (the call or object is then cut by max_tokens:
# finish_reason "length"). The plan is made again whenever the tracker's state moved, and at least
# every REPLAN_EVERY tokens
CALL_MARGIN = 6
MAX_PLAN = 192
REPLAN_EVERY = 16
MAX_RESERVE_NAMES = 16  # the reserve for one more call is priced on at most this many functions
# what a plan tries where neither the grammar forces bytes nor the tracker's hint is allowed: the
# shortest ways on out of a string, a value, an object or an array
FALLBACKS = [
    '"',
    "}",
    "]",
    "0",
    ",",
    " ",
    "1",
    "a",
    "{",
    "[",
    "\n",
    "<",
    "/",
    ">",
    ":",
    "-",
    ".",
    "t",
    "n",
    "f",
]


def grammar_text(guide: Guide, marker_tokens: dict[str, int] | None = None) -> str:
    """The llguidance grammar for a guide (ValueError when llguidance cannot even read it); a tool
    guide's markers as their own tokens where `marker_tokens` has them (engine.structured.tool_calls)."""
    if guide.kind == "json":
        return llguidance.LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
    if guide.kind == "json_schema":
        return llguidance.LLMatcher.grammar_from_json_schema(
            bounded_integers(guide.schema), defaults=JSON_OPTIONS
        )
    if guide.kind == "regex":
        return llguidance.LLMatcher.grammar_from_regex(guide.pattern)
    if guide.calls is not None:
        return llguidance.LLMatcher.grammar_from_lark(resolve_markers(guide.grammar, marker_tokens or {}))
    return llguidance.LLMatcher.grammar_from_lark(guide.grammar)


def overlap_masks(device: torch.device) -> bool:
    """Fill masks on the worker thread while the forward pass runs? Only where it has a core to
    itself: the pass runs on an accelerator, or torch leaves a CPU core free. Where torch's threads
    take every core (the default CPU setup), the worker only slows the pass it was meant to hide
    behind (measured: 0.89 of unconstrained speed against 0.92 filling after the pass,
    kimi-k2-mini, batch 1, 2 cores), so the masks are filled after it."""
    return torch.device(device).type != "cpu" or torch.get_num_threads() < (os.cpu_count() or 1)


class GuideCompiler:
    """One per engine: the llguidance tokenizer (built once, from the model's tokenizer.json and its
    EOS ids) and a bounded cache of compiled grammars keyed by the spec. `encode`: the model's own
    tokenizer (text -> ids), canonical for llguidance where the model has text markers
    (engine.structured.guide_tokenizer)."""

    def __init__(
        self,
        tokenizer_json: str,
        eos_ids: list[int],
        vocab_size: int,
        encode: Callable[[str], list[int]] | None = None,
    ):
        self.vocab_size = vocab_size
        self.eos = eos_ids[0] if eos_ids else None  # what a tool call's closing ends with, between calls
        self._fallbacks: list[int] | None = None
        self.tokenizer = guide_tokenizer(tokenizer_json, eos_ids, vocab_size, encode)
        # markers as tokens only where llguidance reads them as text with the model's own tokenizer
        self.marker_tokens = marker_tokens(tokenizer_json) if encode is not None else {}
        self._compiled: OrderedDict[bytes, llguidance.LLMatcher] = OrderedDict()
        self._lock = threading.Lock()  # check_request runs on callers' threads, matchers on the engine's
        self.executor = llguidance.LLExecutor()  # fans a step's rows out over its threads
        self._bitmask = llg_torch.allocate_token_bitmask(1, vocab_size)  # reused step after step
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="guide-mask")

    def compile(self, guide: Guide, param: str = "response_format") -> llguidance.LLMatcher:
        """A fresh matcher for `guide`; InvalidRequestError(param, llguidance's message) if it does
        not compile."""
        key = msgspec.json.encode(guide)
        with self._lock:
            template = self._compiled.get(key)
            if template is not None:
                self._compiled.move_to_end(key)
                return template.deep_copy()
        try:
            grammar = grammar_text(guide, self.marker_tokens)
        except (ValueError, TypeError) as exc:
            raise InvalidRequestError(param, f"the {guide.kind} guide does not compile: {exc}") from None
        template = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if template.is_error():
            why = template.get_error().strip()
            raise InvalidRequestError(param, f"the {guide.kind} guide does not compile: {why}")
        with self._lock:
            self._compiled[key] = template
            while len(self._compiled) > MAX_COMPILED:
                self._compiled.popitem(last=False)
        return template.deep_copy()

    def bitmask(self, rows: int) -> torch.Tensor:
        """A step's bitmask buffer for `rows` guided rows (one step runs at a time per engine; the
        buffer grows to the largest batch seen rather than being allocated every step)."""
        if self._bitmask.shape[0] < rows:
            self._bitmask = llg_torch.allocate_token_bitmask(rows, self.vocab_size)
        return self._bitmask[:rows]

    def token_bytes(self, token: int) -> bytes:
        """A token's bytes as the tokenizer spells it (a byte-level piece's real bytes)."""
        return self.tokenizer.decode_bytes([token])

    def tokenize(self, text: bytes) -> list[int]:
        return self.tokenizer.tokenize_bytes(text) if text else []

    @property
    def fallbacks(self) -> list[int]:
        """FALLBACKS as single tokens (those the vocabulary spells in one)."""
        if self._fallbacks is None:
            one = [self.tokenize(text.encode()) for text in FALLBACKS]
            self._fallbacks = [ids[0] for ids in one if len(ids) == 1]
        return self._fallbacks


def top_level_keys(schema: dict) -> list[str]:
    """A schema's top-level property names, required ones first: the keys a closing plan tries."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return []
    required = set(schema.get("required") or [])
    return [k for k in props if k in required] + [k for k in props if k not in required]


class GuideState:
    """One sequence's matcher: what it may emit next, fed each token it samples. With a budget,
    any-JSON mode also keeps a JsonCloser, a JSON schema's guide (`schema`) a JsonTracker and a
    tool-call guide (`calls`) a CallTracker: once what is left is only just enough to close the
    object (or the call), the closing tokens are forced (a grammar cannot see max_tokens; without
    this a wandering answer is cut mid-object and is not JSON, or mid-call and is no call). Any
    JSON closes with the closer's own text, always valid there; a schema's closing is planned
    against its grammar, as a call's is (a required key, a string where the closer writes `0`)."""

    def __init__(
        self,
        matcher: llguidance.LLMatcher,
        compiler: GuideCompiler | None = None,
        budget: int | None = None,
        calls: CallFormat | None = None,
        schema: dict | None = None,
    ):
        self.matcher = matcher
        self.compiler = compiler
        budgeted = compiler is not None and budget is not None
        self.closer = JsonCloser() if budgeted and calls is None and schema is None else None
        self.tracker: CallTracker | JsonTracker | None = None
        if budgeted and calls is not None:
            self.tracker = CallTracker(calls.fmt, calls.names, calls.keys, calls.raw, calls.opened)
        elif budgeted and schema is not None:
            self.tracker = JsonTracker(top_level_keys(schema))
        self.left = budget or 0  # tokens still allowed (max_tokens less those consumed)
        self.closed_by_budget = False  # the budget, not the model, closed the object: it ends as "length"
        self._plan: list[int] = []  # a tool call's closing tokens still to force, once it began
        self._cost = 0  # the closing's length when last planned
        self._planned = (-1, 0)  # the tracker's version and the budget left then
        self._reserve: int | None = None  # tokens one more whole call takes (from between calls)

    def fork(self) -> GuideState:
        """An independent copy (matcher, closer, tracker and plan), to try tokens on: a draft's."""
        out = copy.copy(self)
        out.matcher = self.matcher.deep_copy()
        out.closer = copy.deepcopy(self.closer)
        out.tracker = self.tracker.copy() if self.tracker is not None else None
        out._plan = list(self._plan)
        return out

    def consume(self, token: int) -> str | None:
        """Feed the sampled token; an error text when the grammar cannot go on."""
        if not self.matcher.consume_token(token) or self.matcher.is_error():
            return f"{DEAD_GRAMMAR}: {self.matcher.get_error() or f'token {token} is not allowed here'}"
        if self.closer is not None:
            self.left -= 1
            self.closer.feed(self.compiler.token_bytes(token))
        elif self.tracker is not None:
            self.left -= 1
            self.tracker.feed(self.compiler.token_bytes(token))
            if self._plan and self._plan[0] == token:
                self._plan.pop(0)
            else:
                self._plan = []
        return None

    def closing_token(self) -> int | None:
        """The token to force now, or None to let the model choose: the first of the tokens that
        close the object (or the call), once the budget left is within a margin of how many those
        are."""
        if self.tracker is not None:
            return self._call_closing_token()
        closer = self.closer
        if closer is None or closer.lost or self.left > closer.depth + CLOSE_SLACK:
            return None  # (a cheap bound first: the closing text is at most depth + a few bytes)
        suffix = closer.suffix()
        if not suffix:
            return None
        tokens = self.compiler.tokenize(suffix)
        return tokens[0] if tokens and self.left <= len(tokens) + CLOSE_MARGIN else None

    def close_refused(self) -> None:
        """The grammar did not allow the forced token: plan again at the next step."""
        self._plan, self._planned = [], (-1, 0)

    # --- tool calls and JSON schemas: a closing planned against the grammar ---

    def _call_closing_token(self) -> int | None:
        tracker = self.tracker
        if tracker.lost:
            return None
        if self._plan:
            return self._plan[0]
        reserve = self._reserve_here() if tracker.between else 0
        version, at = self._planned
        stale = version != tracker.version or at - self.left >= REPLAN_EVERY
        if not stale and self.left > self._cost + CALL_MARGIN + reserve:
            return None
        plan = self._plan_from(self.matcher.deep_copy(), tracker.copy())
        self._planned = (tracker.version, self.left)
        self._cost = 0 if plan is None else len(plan)  # (none found: planned again when the state moves)
        if not plan or self.left > len(plan) + CALL_MARGIN + reserve:
            return None  # nothing to close, or room still to go on
        if self.left < len(plan) and not tracker.between:
            return None  # no room left to close it (between calls, the end goes on all the same:
            # its marker cut off leaves the calls before it whole, where another call would not)
        self._plan = plan
        return plan[0]

    def _reserve_here(self) -> int:
        """Tokens another whole call takes from here, between calls: the dearest of the functions'
        shortest calls (0 where no call may follow)."""
        if self._reserve is None:
            self._reserve = 0
            for name in self.tracker.names[-MAX_RESERVE_NAMES:]:
                matcher, tracker = self.matcher.deep_copy(), self.tracker.copy()
                opener = tracker.next_call(name)
                tokens = self.compiler.tokenize(opener)
                if matcher.validate_tokens(tokens) < len(tokens) or not matcher.consume_tokens(tokens):
                    continue
                tracker.feed(opener)
                plan = self._plan_from(matcher, tracker)
                self._reserve = max(self._reserve, len(tokens) + (MAX_PLAN if plan is None else len(plan)))
        return self._reserve

    def _plan_from(self, matcher: llguidance.LLMatcher, tracker: CallTracker) -> list[int] | None:
        """The tokens that end the reply from the state of `matcher` and `tracker` (both changed):
        [] when it may end here, None when no closing was found within MAX_PLAN tokens. Where it
        may end but the tracker is between calls, the end is the EOS token."""
        compiler, eos = self.compiler, self.compiler.eos
        if matcher.is_stopped():
            return []
        if matcher.is_accepting() and not tracker.between:
            return []
        plan: list[int] = []
        while len(plan) < MAX_PLAN:
            if matcher.is_stopped():
                return plan
            if matcher.is_accepting():
                return plan + [eos] if eos is not None else plan
            take = matcher.compute_ff_tokens() or self._hinted(matcher, tracker) or self._fallback(matcher)
            if not take or not matcher.consume_tokens(take):
                return None
            for token in take:
                tracker.feed(compiler.token_bytes(token))
            plan += take
        return None

    def _hinted(self, matcher: llguidance.LLMatcher, tracker: CallTracker) -> list[int]:
        """The tracker's first hint the grammar takes whole, else the longest part of one it takes."""
        best: list[int] = []
        for hint in tracker.hints():
            tokens = self.compiler.tokenize(hint)
            allowed = matcher.validate_tokens(tokens) if tokens else 0
            if tokens and allowed == len(tokens):
                return tokens
            if allowed > len(best):
                best = tokens[:allowed]
        return best

    def _fallback(self, matcher: llguidance.LLMatcher) -> list[int]:
        """The first FALLBACKS token the grammar allows; else the lowest token id it allows."""
        for token in self.compiler.fallbacks:
            if matcher.validate_tokens([token]):
                return [token]
        mask = int.from_bytes(matcher.compute_bitmask(), "little")
        if self.compiler.eos is not None:
            mask &= ~(1 << self.compiler.eos)
        return [(mask & -mask).bit_length() - 1] if mask else []

    @property
    def complete(self) -> bool:
        """The grammar is done: nothing but the end may follow."""
        return self.matcher.is_stopped()


class GuideBatch:
    """The guided rows of one sampling step: their bitmask, filled on a worker thread."""

    def __init__(self, compiler: GuideCompiler, rows: list[int], guides: list[GuideState]):
        self.compiler = compiler
        self.rows = rows
        self.guides = guides
        self.bitmask = compiler.bitmask(len(rows))
        self._future: Future | None = None

    def start(self) -> None:
        """Compute the masks in the background (call before the forward pass)."""
        self._future = self.compiler.worker.submit(self._fill)

    def _fill(self) -> None:
        if len(self.guides) <= SERIAL_ROWS:  # a hand-off to the executor's threads costs more than these
            for i, g in enumerate(self.guides):
                llg_torch.fill_next_token_bitmask(g.matcher, self.bitmask, i)
        else:
            pairs = [(g.matcher, i) for i, g in enumerate(self.guides)]
            llg_torch.fill_next_token_bitmask_par(self.compiler.executor, pairs, self.bitmask)
        for i, g in enumerate(self.guides):
            _close(g, self.bitmask[i])

    def apply(self, logits: torch.Tensor) -> list[str | None]:
        """Mask the guided rows of `logits` in place (disallowed tokens to -inf); per guided row, an
        error text when its grammar allows no token at all (it cannot continue)."""
        if self._future is None:  # not started: fill them here
            self._fill()
        else:
            self._future.result()
        errors = [g.matcher.get_error() if g.matcher.is_error() else None for g in self.guides]
        bits = mask_logits(logits, self.rows, self.bitmask)
        alive = bits.ne(0).any(dim=1).tolist()  # (bits past the vocabulary are never set)
        return [
            f"{DEAD_GRAMMAR}: {err or 'the grammar allows no token here'}" if err or not ok else None
            for err, ok in zip(errors, alive, strict=True)
        ]


def force_token(mask: torch.Tensor, token: int) -> bool:
    """Leave `token` the only allowed one of a bitmask row, if the row allows it (else leave it)."""
    word, bit = divmod(token, 32)
    if not (int(mask[word]) >> bit) & 1:
        return False
    with torch.inference_mode():  # the bitmask was made in the engine's inference mode
        mask.zero_()
        mask[word] = (1 << bit) - (1 << 32 if bit == 31 else 0)  # an int32 word
    return True


def _allowed(mask: torch.Tensor, token: int) -> bool:
    word, bit = divmod(token, 32)
    return word < mask.shape[0] and bool((int(mask[word]) >> bit) & 1)


def mask_logits(logits: torch.Tensor, rows: list[int], bitmask: torch.Tensor) -> torch.Tensor:
    """Disallowed tokens of `logits[rows]` to -inf, in place, from their bitmask rows (one gather
    and one add); returns the bitmask on the logits' device."""
    count, vocab = len(rows), logits.shape[-1]
    bits = bitmask.to(logits.device, non_blocking=True)  # (the int32 words, not the floats, travel)
    table = _byte_bias(logits.device, logits.dtype)
    bias = table.index_select(0, bits.view(torch.uint8).flatten().long()).view(count, -1)
    if bias.shape[1] < vocab:  # model rows past the tokenizer's vocabulary: never allowed
        bias = torch.cat([bias, bias.new_full((count, vocab - bias.shape[1]), float("-inf"))], dim=1)
    bias = bias[:, :vocab]
    if rows == list(range(logits.shape[0])):  # every row: in place
        logits.add_(bias)
    else:
        logits.index_add_(0, torch.tensor(rows, device=logits.device), bias)
    return bits


class GuidedDraft:
    """A guided sequence's draft checked against its grammar before the verify pass.

    Verify row j is the step a sequence would decode after the draft's first j tokens, so its mask
    is the grammar's after them, made exactly as a one-token step makes it (the budget's forced
    closing token included): `states[j]` is a fork of the sequence's guide that consumed
    draft[:j], its closing asked once, as GuideBatch asks it. The draft is cut before its first
    token the row's mask refuses (no model pick could equal it) and before a token after which
    the grammar allows nothing (that row's error is met by the next one-token step). The
    sequence's own guide is not touched: once the step's tokens are known, the sequence takes
    the state after its accepted draft tokens (`state_after`) and consumes its own token there."""

    def __init__(self, compiler: GuideCompiler, guide: GuideState, draft: list[int]):
        bits = llg_torch.allocate_token_bitmask(len(draft) + 1, compiler.vocab_size)
        self.states: list[GuideState] = []
        self.draft: list[int] = []
        state = guide.fork()
        for j in range(len(draft) + 1):
            llg_torch.fill_next_token_bitmask(state.matcher, bits, j)
            if state.matcher.is_error() or not bool(bits[j].ne(0).any()):
                if j:  # the grammar allows nothing after draft[j - 1]: it is not drafted
                    self.draft.pop()
                break
            _close(state, bits[j])
            self.states.append(state)
            if j == len(draft) or not _allowed(bits[j], draft[j]):
                break
            state = state.fork()
            if state.consume(draft[j]) is not None:
                break
            self.draft.append(draft[j])
            if state.complete:  # it ends at this token: the next row is never sampled
                bits[j + 1].fill_(-1)
                self.states.append(state)
                break
        self.states = self.states[: len(self.draft) + 1]
        self.bitmask = bits[: len(self.states)]

    def state_after(self, accepted: int) -> GuideState:
        """The grammar's state after the first `accepted` draft tokens, its closing asked."""
        return self.states[accepted]


def _close(guide: GuideState, mask: torch.Tensor) -> None:
    """GuideBatch's closing for one row: its forced token alone in `mask`, when the budget says so."""
    try:
        if (token := guide.closing_token()) is None:
            return
        if force_token(mask, token):
            guide.closed_by_budget = True
        else:
            guide.close_refused()
    except Exception:  # a closing that fails leaves the row to its grammar
        log.exception("closing a guided row failed; its grammar alone decides")
        if guide.closer is not None:
            guide.closer.lost = True
        if guide.tracker is not None:
            guide.tracker.lost = True
