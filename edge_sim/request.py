"""The one typed request that flows down the AI path and the one typed result that comes back up.

The runtime validates a call once, where it enters (HTTP body or binding inputs), into a
GenerateRequest; the edge routes it, a PoP node (in-process or over msgspec-over-HTTP) tokenizes it
once and runs it. The answer comes back as a GenerateResult (text, usage, finish reason, formats
and, from the edge, the latency account), which only the runtime's HTTP edge shapes into Workers AI
or OpenAI JSON.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from edge_sim.accounting import LatencyAccount
from edge_sim.errors import EdgeError
from engine import SamplingParams
from engine.errors import GenerationError
from engine.sched.fair_queue import TenantShare
from engine.structured.choices import Choice, ChoiceAssembler
from engine.structured.reasoning_parser import thinks
from engine.structured.tool_calls import format_for
from engine.structured.tool_types import ToolChoice, ToolFunction

if TYPE_CHECKING:
    from engine import LLM

CHARS_PER_TOKEN = 4  # about right for English and code under BPE tokenizers; enough to rank PoPs
TOKENS_PER_MESSAGE = 4  # a chat template's role markers around each message


class Formats(NamedTuple):
    """The formats an engine serves a model in: weights (one label), KV cache, weights per part,
    and its tool-call format (engine.structured.tool_calls; "" for none), which the edge parses replies by."""

    weights: str
    kv_cache: str
    weights_by_part: dict[str, str]
    tool_format: str = ""
    reasoning_format: str = ""  # the family whose reasoning markers it writes ("": it does not think)
    # how its uncompressed matrices are held and multiplied (engine.load.weight_parts.dense_path:
    # "bf16 (edge_cpu, avx512_bf16)", "f32 (widened at load)", ...); "" where the PoP does not say
    dense_path: str = ""

    @classmethod
    def of(cls, llm: LLM) -> Formats:
        family = format_for(llm.config.model_type)
        vocabulary = llm.tokenizer.vocabulary  # computed once per tokenizer
        return cls(
            llm.weights_label,
            llm.kv_cache_dtype,
            llm.weight_formats,
            family,
            thinks(family, vocabulary),
            llm.dense_path,
        )

    @classmethod
    def unknown(cls) -> Formats:
        return cls("", "", {})


class GenerateRequest(msgspec.Struct, kw_only=True):
    """A validated call: its model (the catalog name that serves it), prompt or chat messages,
    sampling parameters and tenant. Carried unchanged to the PoP, over the wire to a remote one.
    `prompt` is text the model continues as written (Workers AI's `raw: true`, OpenAI's
    /completions); `messages` go through the model's chat template (a Workers AI prompt without
    raw arrives here as one user message)."""

    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    params: SamplingParams
    tenant: str = "local"
    share: TenantShare = TenantShare()  # the account's fair-share weight and KV share
    session: str | None = None  # x-session-affinity: back to the PoP that served it (edge_sim.affinity)
    # tools the model may call: the PoP renders them (and a tool round trip's messages) in the
    # model's own tool-call format and constrains the output to it (engine.structured.tool_calls)
    tools: list[ToolFunction] | None = None
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    # thinking (chat_template_kwargs.enable_thinking, reasoning_effort): None is the model's default
    # (on, for a model that thinks); rendered by its chat template, parsed by
    # engine.structured.reasoning_parser
    thinking: bool | None = None
    # rejectIfBusy (Workers AI's option): refused at once (no_capacity, "busy") when every PoP that
    # serves the model would queue it, instead of waiting in that queue (edge_sim.edge.Edge.stream)
    reject_if_busy: bool = False

    def estimated_tokens(self) -> int:
        """The prompt's length in tokens, estimated from its characters, for routing: only the PoP
        that serves the request tokenizes it (with the template and tokenizer it really runs)."""
        if self.messages is None:
            return -(-len(self.prompt or "") // CHARS_PER_TOKEN)
        chars = sum(len(str(m.get("content", ""))) for m in self.messages)
        return -(-chars // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(self.messages)

    def assembler(self, formats: Formats) -> ChoiceAssembler:
        """What turns this request's engine events into its choices, for the family `formats` names."""
        return ChoiceAssembler(
            self.params.n,
            logprobs=self.params.logprobs is not None,
            tools=self.tools,
            tool_choice=self.tool_choice,
            parallel_tool_calls=self.parallel_tool_calls,
            tool_format=formats.tool_format,
            reasoning_format=formats.reasoning_format,
            thinking=self.thinking,
        )


class GenerateResult(msgspec.Struct, kw_only=True):
    """One whole answer: what the PoP produced and, once the edge has it, how long each part took."""

    text: str
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    queue_ms: float
    prefill_ms: float
    decode_ms: float
    pop: str
    model: str
    formats: Formats
    timing: LatencyAccount | None = None  # set by the edge (network parts need the ingress)
    cached_tokens: int = 0  # prompt tokens the PoP's prefix cache held (not run again)
    # every choice in index order (choice 0's text and finish_reason are `text` and `finish_reason`;
    # completion_tokens counts all of them, as OpenAI's usage does)
    choices: list[Choice] = msgspec.field(default_factory=list)

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    @classmethod
    def assembled(cls, choices: ChoiceAssembler, pop: str, model: str, formats: Formats) -> GenerateResult:
        """The whole answer once every choice has ended (the last event carries the metrics); a
        request whose every choice failed is an invalid_input error."""
        try:
            made, m = choices.choices()
        except GenerationError as exc:
            raise EdgeError("invalid_input", str(exc)) from None
        return cls(
            text=made[0].text,
            finish_reason=made[0].finish_reason,
            prompt_tokens=m.prompt_tokens,
            completion_tokens=sum(c.completion_tokens for c in made),
            queue_ms=m.queue_ms,
            prefill_ms=m.prefill_ms,
            decode_ms=m.decode_ms,
            pop=pop,
            model=model,
            formats=formats,
            cached_tokens=m.cached_tokens,
            choices=made,
        )
