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
from edge_sim.reasoning_parser import thinks
from engine import SamplingParams
from engine.fair_queue import TenantShare
from engine.sequence import Logprobs
from engine.tool_calls import format_for
from engine.tool_types import ToolCall, ToolChoice, ToolFunction

if TYPE_CHECKING:
    from engine import LLM

CHARS_PER_TOKEN = 4  # about right for English and code under BPE tokenizers; enough to rank PoPs
TOKENS_PER_MESSAGE = 4  # a chat template's role markers around each message


class Formats(NamedTuple):
    """The formats an engine serves a model in: weights (one label), KV cache, weights per part,
    and its tool-call format (engine.tool_calls; "" for none), which the edge parses replies by."""

    weights: str
    kv_cache: str
    weights_by_part: dict[str, str]
    tool_format: str = ""
    reasoning_format: str = ""  # the family whose reasoning markers it writes ("": it does not think)

    @classmethod
    def of(cls, llm: LLM) -> Formats:
        family = format_for(llm.config.model_type)
        vocabulary = llm.tokenizer.vocabulary  # computed once per tokenizer
        return cls(
            llm.weights_label, llm.kv_cache_dtype, llm.weight_formats, family, thinks(family, vocabulary)
        )

    @classmethod
    def unknown(cls) -> Formats:
        return cls("", "", {})


class GenerateRequest(msgspec.Struct, kw_only=True):
    """A validated call: its model (the catalog name that serves it), prompt or chat messages,
    sampling parameters and tenant. Carried unchanged to the PoP, over the wire to a remote one."""

    model: str
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None
    params: SamplingParams
    tenant: str = "local"
    share: TenantShare = TenantShare()  # the account's fair-share weight and KV share
    session: str | None = None  # x-session-affinity: back to the PoP that served it (edge_sim.affinity)
    # tools the model may call: the PoP renders them (and a tool round trip's messages) in the
    # model's own tool-call format and constrains the output to it (engine.tool_calls)
    tools: list[ToolFunction] | None = None
    tool_choice: ToolChoice = "auto"
    parallel_tool_calls: bool = True
    # thinking (chat_template_kwargs.enable_thinking, reasoning_effort): None is the model's default
    # (on, for a model that thinks); rendered by its chat template, parsed by edge_sim.reasoning_parser
    thinking: bool | None = None

    def estimated_tokens(self) -> int:
        """The prompt's length in tokens, estimated from its characters, for routing: only the PoP
        that serves the request tokenizes it (with the template and tokenizer it really runs)."""
        if self.messages is None:
            return -(-len(self.prompt or "") // CHARS_PER_TOKEN)
        chars = sum(len(str(m.get("content", ""))) for m in self.messages)
        return -(-chars // CHARS_PER_TOKEN) + TOKENS_PER_MESSAGE * len(self.messages)


class ToolCallDelta(msgspec.Struct, kw_only=True):
    """A piece of a streamed tool call, as OpenAI streams it: the first piece of call `index`
    carries its id and name, the rest pieces of its arguments' text."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


class Delta(msgspec.Struct, kw_only=True):
    """A piece of a streamed answer for choice `index`: text, its tokens' logprobs (when asked
    for), and pieces of tool calls parsed from the model's tool-call format."""

    text: str = ""
    index: int = 0
    logprobs: list[Logprobs] | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning: str = ""  # a piece of the model's reasoning (edge_sim.reasoning_parser)


class Choice(msgspec.Struct, kw_only=True):
    """One of a request's n answers: its text (tool-call markup removed), how it ended, its tokens,
    their logprobs when asked for, and the tool calls it made (finish_reason "tool_calls")."""

    index: int = 0
    text: str
    finish_reason: str
    completion_tokens: int
    logprobs: list[Logprobs] | None = None
    tool_calls: list[ToolCall] | None = None
    reasoning: str = ""  # what it thought before answering ("" when it did not, or cannot)
    reasoning_tokens: int = 0  # of completion_tokens, those spent thinking


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
