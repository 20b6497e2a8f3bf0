"""The streaming parser of a model's reasoning: text deltas in, (reasoning, content) out.

GLM-4.5 and Kimi K2 (Thinking, K2.5, K2.6) think before they answer, inside `<think>` ... `</think>`
at the start of their reply (the families' markers are one row each of MARKERS). Their chat templates
switch it: with thinking off (`enable_thinking` / `thinking` false) the template writes an empty
`<think></think>` itself and the reply is all content (as vLLM's glm45 and kimi_k2 parsers take it: a
literal `<think>` the model then writes stays content), less the newline the layout puts after the
block. With thinking on, a reply that begins (after white space) with the open marker is reasoning
up to the close marker, and content after it; one that does not is all content; one cut off inside
the block (max_tokens) is all reasoning. A marker split across deltas is held back until the next
says whether it is one, so no piece of a marker reaches either side.

A model thinks when its tokenizer knows its family's markers as text (`thinks`): the shipped GLM-4.5
miniature does (its `<think>` and `</think>` are tokens of its own, and it writes an empty block before
each answer, as GLM-4.5 does when a question needs no thought); the Kimi K2 miniature, like Kimi K2
Instruct, does not, so its requests take the thinking switches and answer with no reasoning.
"""

from __future__ import annotations

from engine.structured.tool_calls import GLM45, KIMI_K2

# family -> (open, close): the reasoning block's markers
MARKERS: dict[str, tuple[str, str]] = {
    GLM45: ("<think>", "</think>"),
    KIMI_K2: ("<think>", "</think>"),
}


def thinks(family: str, vocabulary: set[str] | frozenset[str]) -> str:
    """`family` when a model of it can think (its vocabulary holds both markers), else ""."""
    markers = MARKERS.get(family)
    return family if markers is not None and all(m in vocabulary for m in markers) else ""


def _held(text: str, marker: str) -> int:
    """How many characters at the end of `text` may be the start of `marker`."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningParser:
    """One choice's reply, fed delta by delta: `feed(text)` and, at its end, `flush()` each
    answer (reasoning, content) to send now."""

    def __init__(self, family: str, closed: bool = False):
        """`closed`: the request turned thinking off, so the template wrote the empty block itself:
        the reply is all content, less the newlines that follow the block in the template's layout
        (a literal open marker the model writes then stays content, as vLLM's parsers leave it)."""
        self.open, self.close = MARKERS[family]
        # start (before any non-space text) -> reasoning -> after (the block's newlines) -> content
        self._state = "after" if closed else "start"
        self._buf = ""

    @property
    def thinking(self) -> bool:
        """Whether the reply is (still, or perhaps: it has not begun) inside its reasoning."""
        return self._state in ("start", "reasoning")

    def feed(self, text: str) -> tuple[str, str]:
        self._buf += text
        reasoning = content = ""
        while True:
            if self._state == "start":
                stripped = self._buf.lstrip()
                if not stripped:
                    return reasoning, content
                if stripped.startswith(self.open):
                    self._buf, self._state = stripped[len(self.open) :], "reasoning"
                    continue
                if self.open.startswith(stripped):  # perhaps the marker, cut: wait for more
                    return reasoning, content
                self._state = "content"
            if self._state == "reasoning":
                at = self._buf.find(self.close)
                if at < 0:
                    keep = _held(self._buf, self.close)
                    reasoning += self._buf[: len(self._buf) - keep]
                    self._buf = self._buf[len(self._buf) - keep :]
                    return reasoning, content
                reasoning += self._buf[:at]
                # the template's own layout puts a newline or two after the block: not the answer's
                self._buf, self._state = self._buf[at + len(self.close) :].lstrip("\n"), "after"
                if not self._buf:
                    return reasoning, content
            if self._state == "after":  # just after the block: its newlines are dropped
                self._buf = self._buf.lstrip("\n")
                if not self._buf:
                    return reasoning, content
                self._state = "content"
            content += self._buf
            self._buf = ""
            return reasoning, content

    def flush(self) -> tuple[str, str]:
        """The reply has ended: what was held back (a block cut off is reasoning)."""
        rest, self._buf = self._buf, ""
        if self._state == "reasoning":
            return rest, ""
        if self._state == "start":
            return "", rest  # only white space, or a marker's beginning: the model's text
        return "", rest
