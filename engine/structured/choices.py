"""A request's n choices assembled from its engine events: the Delta items a stream yields and the
Choice of each at its end (the edge wraps them in its GenerateResult with usage and timing).

Each event names its choice (SeqEvent.index). A thinking model's reasoning is split from its answer
first (engine.structured.reasoning_parser), so a tool call is looked for only in the answer, never inside the
reasoning. Tool-call markup is parsed per choice
(engine.structured.tool_parser) when the request declared tools, so no delta carries markup, and a call
goes out whole once it has ended and its arguments were checked; a choice ends "tool_calls" only
when every call it began has ended (one cut off by max_tokens is dropped and the choice ends
"length", as OpenAI's does); logprobs ride with the delta of their token when they were asked for.
A choice that fails while others finish keeps finish_reason "error"; a request whose every choice
failed (its one, when n is 1) fails.
"""

from __future__ import annotations

import msgspec

from engine.errors import GenerationError
from engine.outputs import Logprobs, RequestMetrics, SeqEvent
from engine.structured.reasoning_parser import ReasoningParser
from engine.structured.tool_parser import ToolCallParser
from engine.structured.tool_types import ToolCall, ToolCallDelta, ToolChoice, ToolFunction


class Delta(msgspec.Struct, kw_only=True):
    """A piece of a streamed answer for choice `index`: text, its tokens' logprobs (when asked
    for), and pieces of tool calls parsed from the model's tool-call format."""

    text: str = ""
    index: int = 0
    logprobs: list[Logprobs] | None = None
    tool_calls: list[ToolCallDelta] | None = None
    reasoning: str = ""  # a piece of the model's reasoning (engine.structured.reasoning_parser)


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


class _ChoiceState:
    """What one choice has produced so far."""

    def __init__(self, parser: ToolCallParser | None, logprobs: bool, reasoning: ReasoningParser | None):
        self.parser = parser
        self.reasoning = reasoning
        self.thought: list[str] = []  # its reasoning's pieces
        self.thinking_tokens = 0  # tokens that came while it was thinking
        self.pieces: list[str] = []
        self.logprobs: list[Logprobs] | None = [] if logprobs else None
        self.tokens = 0
        self.last: SeqEvent | None = None  # its final event


class ChoiceAssembler:
    """push(event) -> the deltas to stream for it; result(...) once every choice has ended."""

    def __init__(
        self,
        n: int = 1,
        *,
        logprobs: bool = False,
        tools: list[ToolFunction] | None = None,
        tool_choice: ToolChoice = "auto",
        parallel_tool_calls: bool = True,
        tool_format: str = "",
        reasoning_format: str = "",
        thinking: bool | None = None,
    ):
        """`tool_format`: the family whose tool-call markup the model writes ("": none); calls are
        parsed only when tools were declared and tool_choice is not "none". `reasoning_format`: the
        family whose reasoning the model writes ("": it does not think); with thinking off
        (`thinking` False) the template closed the block itself (ReasoningParser's `closed`)."""
        parse = bool(tools) and tool_choice != "none" and bool(tool_format)
        think = bool(reasoning_format)
        self._choices = [
            _ChoiceState(
                ToolCallParser(tool_format, tools, tool_choice, parallel_tool_calls) if parse else None,
                logprobs,
                ReasoningParser(reasoning_format, closed=thinking is False) if think else None,
            )
            for _ in range(n)
        ]
        self.last: SeqEvent | None = None  # the latest final event: it carries the request's metrics

    def speculated(self) -> tuple[int, int]:
        """Draft tokens verified for every choice together, and how many of them were kept."""
        metrics = [c.last.metrics for c in self._choices if c.last is not None and c.last.metrics]
        return sum(m.draft_tokens for m in metrics), sum(m.accepted_tokens for m in metrics)

    @property
    def done(self) -> bool:
        return all(c.last is not None for c in self._choices)

    def push(self, event: SeqEvent) -> Delta | None:
        """The delta to stream for `event` (None when it adds nothing a client sees)."""
        if not 0 <= event.index < len(self._choices):
            raise GenerationError(f"generation failed: an event for choice {event.index}")
        choice = self._choices[event.index]
        if event.token_id is not None:
            choice.tokens += 1
        logprobs = [event.logprobs] if event.logprobs is not None and choice.logprobs is not None else None
        if logprobs:
            choice.logprobs.extend(logprobs)
        text, calls, thought = event.text, [], ""
        ended = event.finish_reason is not None
        if choice.reasoning is not None:
            if event.token_id is not None and choice.reasoning.thinking:
                choice.thinking_tokens += 1
            thought, text = choice.reasoning.feed(text)
            if ended:
                more_thought, rest = choice.reasoning.flush()
                thought, text = thought + more_thought, text + rest
            if thought:
                choice.thought.append(thought)
        if choice.parser is not None:
            text, calls = choice.parser.feed(text)
        if ended:
            choice.last = event
            if event.metrics is not None:
                self.last = event
            if choice.parser is not None:
                tail, more = choice.parser.flush()
                text, calls = text + tail, calls + more
        if choice.parser is None and text:
            choice.pieces.append(text)
        if not (text or logprobs or calls or thought):
            return None
        return Delta(
            text=text, index=event.index, logprobs=logprobs, tool_calls=calls or None, reasoning=thought
        )

    def _choice(self, index: int, state: _ChoiceState) -> Choice:
        last = state.last
        assert last is not None and last.finish_reason is not None
        text, calls = "".join(state.pieces), None
        reason = last.finish_reason
        if state.parser is not None:
            text, made = state.parser.finish()
            calls = made or None
            # "tool_calls" only when every call it began has ended: one cut off by max_tokens was
            # dropped, and the choice ends "length" (a call the budget closed has ended)
            if made and reason in ("stop", "length") and state.parser.complete:
                reason = "tool_calls"
        tokens = last.metrics.completion_tokens if last.metrics is not None else state.tokens
        return Choice(
            index=index,
            text=text,
            finish_reason=reason,
            completion_tokens=tokens,
            logprobs=state.logprobs,
            tool_calls=calls,
            reasoning="".join(state.thought),
            reasoning_tokens=min(tokens, state.thinking_tokens) if state.thought else 0,
        )

    def choices(self) -> tuple[list[Choice], RequestMetrics]:
        """Every choice in index order once each has ended, and the request's metrics (on the last
        event); a request whose every choice failed raises, naming the first failure."""
        assert self.done and self.last is not None and self.last.metrics is not None
        failed = [c.last for c in self._choices if c.last.finish_reason == "error"]
        if len(failed) == len(self._choices):  # nothing to answer with
            raise GenerationError(f"generation failed: {failed[0].error}")
        return [self._choice(i, c) for i, c in enumerate(self._choices)], self.last.metrics
