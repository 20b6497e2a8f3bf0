"""The streaming parser of a model's tool-call format (engine.tool_calls): text deltas in, content
and OpenAI-shaped tool-call pieces out.

Markup never reaches the content: a delta that ends inside what may be a marker is held back until
the next delta says whether it is one. A call's first piece carries its id and name, the rest pieces
of its arguments' JSON text; the pieces of one call join to the arguments `finish` returns. GLM-4.5
writes arguments as key/value pairs, so its pieces are that object's JSON, written as each pair
completes (a string-typed argument as a string, any other as the JSON it was written in).
"""

from __future__ import annotations

import json
import re
import uuid

from edge_sim.request import ToolCallDelta
from engine import tool_calls as fmts
from engine.tool_types import ToolCall, ToolFunction

MAX_HEAD_CHARS = 256  # a call's name part longer than this is not a call: the text goes out as content
_GLM_PAIR = re.compile(
    rf"{re.escape(fmts.GLM_KEY_BEGIN)}(.*?){re.escape(fmts.GLM_KEY_END)}\s*"
    rf"{re.escape(fmts.GLM_VALUE_BEGIN)}(.*?){re.escape(fmts.GLM_VALUE_END)}",
    re.DOTALL,
)


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _held(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` may be the start of one of `markers`."""
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


class ToolCallParser:
    """feed(text) -> (content, pieces); flush() at the end of the output; finish() -> (the whole
    content, the calls). `tools` (when known) say which GLM-4.5 arguments are strings."""

    def __init__(self, fmt: str, tools: list[ToolFunction] | None = None):
        if fmt not in (fmts.KIMI_K2, fmts.GLM45):
            raise ValueError(f"no tool-call format {fmt!r}")
        self.fmt = fmt
        self._string_args = {
            t.name: {k for k, s in (t.parameters.get("properties") or {}).items() if fmts.glm_raw_string(s)}
            for t in tools or []
        }
        self._buf = ""
        self._state = "text"
        self._after_call = False  # GLM-4.5: whitespace between calls is not content
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._pairs = 0  # GLM-4.5: arguments written for the open call
        self.complete = True  # every call started has ended

    # --- the stream ---

    def feed(self, text: str) -> tuple[str, list[ToolCallDelta]]:
        self._buf += text
        content: list[str] = []
        pieces: list[ToolCallDelta] = []
        while self._step(content, pieces):
            pass
        out = "".join(content)
        self._content.append(out)
        return out, pieces

    def flush(self) -> tuple[str, list[ToolCallDelta]]:
        """The end of the output: held-back text goes out (inside a call's arguments, to them)."""
        rest, self._buf = self._buf, ""
        if self._state == "text":
            rest = rest.lstrip() if self._after_call else rest
            self._content.append(rest)
            return rest, []
        if self._state == "args" and self.fmt == fmts.KIMI_K2 and rest:
            return "", [self._piece(rest)]
        return "", []  # an unfinished marker or key/value pair: nothing a client can use

    def finish(self) -> tuple[str, list[ToolCall]]:
        return "".join(self._content), list(self._calls)

    # --- the states ---

    def _step(self, content: list[str], pieces: list[ToolCallDelta]) -> bool:
        """Consume what the buffer allows in the current state; whether to go on."""
        if self._state == "text":
            return self._text(content)
        if self._state == "section":
            return self._section(content)
        if self._state == "head":
            return self._head(content, pieces)
        return self._kimi_args(pieces) if self.fmt == fmts.KIMI_K2 else self._glm_args(content, pieces)

    def _text(self, content: list[str]) -> bool:
        opener = fmts.KIMI_SECTION_BEGIN if self.fmt == fmts.KIMI_K2 else fmts.GLM_CALL_BEGIN
        if self._after_call:
            self._buf = self._buf.lstrip()
            if not self._buf:
                return False
        at = self._buf.find(opener)
        if at < 0:
            keep = _held(self._buf, (opener,))
            if len(self._buf) > keep:
                content.append(self._buf[: len(self._buf) - keep])
                self._buf, self._after_call = self._buf[len(self._buf) - keep :], False
            return False
        content.append(self._buf[:at])
        self._buf = self._buf[at + len(opener) :]
        self._state = "section" if self.fmt == fmts.KIMI_K2 else "head"
        return True

    def _section(self, content: list[str]) -> bool:
        """Kimi K2, between calls: the next call or the section's end."""
        self._buf = self._buf.lstrip()
        for marker, state in ((fmts.KIMI_CALL_BEGIN, "head"), (fmts.KIMI_SECTION_END, "text")):
            if self._buf.startswith(marker):
                self._buf, self._state = self._buf[len(marker) :], state
                return True
        if any(m.startswith(self._buf) for m in (fmts.KIMI_CALL_BEGIN, fmts.KIMI_SECTION_END)):
            return False  # not enough yet to tell
        self._state = "text"  # not the format (an unguided model): the rest is content
        return True

    def _head(self, content: list[str], pieces: list[ToolCallDelta]) -> bool:
        if self.fmt == fmts.KIMI_K2:
            at = self._buf.find(fmts.KIMI_ARGS_BEGIN)
            skip = len(fmts.KIMI_ARGS_BEGIN)
        else:
            ends = [
                i
                for i in (self._buf.find(m) for m in ("\n", fmts.GLM_KEY_BEGIN, fmts.GLM_CALL_END))
                if i >= 0
            ]
            at = min(ends, default=-1)
            skip = 1 if at >= 0 and self._buf[at] == "\n" else 0
        if at < 0:
            if len(self._buf) > MAX_HEAD_CHARS:
                self._state = "text"
                return True
            return False
        head, self._buf = self._buf[:at].strip(), self._buf[at + skip :]
        name = head.removeprefix("functions.").rsplit(":", 1)[0] if self.fmt == fmts.KIMI_K2 else head
        call = ToolCall(id=call_id(), name=name, arguments="")
        self._calls.append(call)
        self.complete, self._pairs, self._state = False, 0, "args"
        pieces.append(ToolCallDelta(index=len(self._calls) - 1, id=call.id, name=name))
        return True

    def _kimi_args(self, pieces: list[ToolCallDelta]) -> bool:
        at = self._buf.find(fmts.KIMI_CALL_END)
        if at < 0:
            keep = _held(self._buf, (fmts.KIMI_CALL_END,))
            if len(self._buf) > keep:
                pieces.append(self._piece(self._buf[: len(self._buf) - keep]))
                self._buf = self._buf[len(self._buf) - keep :]
            return False
        if at:
            pieces.append(self._piece(self._buf[:at]))
        self._buf, self._state, self.complete = self._buf[at + len(fmts.KIMI_CALL_END) :], "section", True
        return True

    def _glm_args(self, content: list[str], pieces: list[ToolCallDelta]) -> bool:
        self._buf = self._buf.lstrip()
        if self._buf.startswith(fmts.GLM_CALL_END):
            pieces.append(self._piece("}" if self._pairs else "{}"))
            self._buf = self._buf[len(fmts.GLM_CALL_END) :]
            self._state, self._after_call, self.complete = "text", True, True
            return True
        pair = _GLM_PAIR.match(self._buf)
        if pair is not None:
            key, value = pair.group(1).strip(), pair.group(2)
            written = json.dumps(key, ensure_ascii=False) + ": " + self._glm_value(key, value)
            pieces.append(self._piece(("{" if not self._pairs else ", ") + written))
            self._pairs += 1
            self._buf = self._buf[pair.end() :]
            return True
        if self._buf.startswith(fmts.GLM_KEY_BEGIN) or fmts.GLM_KEY_BEGIN.startswith(self._buf):
            return False  # a pair still being written
        if fmts.GLM_CALL_END.startswith(self._buf):
            return False
        self._state = "text"  # not the format: the rest is content
        return True

    def _glm_value(self, key: str, raw: str) -> str:
        strings = self._string_args.get(self._calls[-1].name)
        if strings is not None and key in strings:
            return json.dumps(raw, ensure_ascii=False)
        try:
            return json.dumps(json.loads(raw), ensure_ascii=False)
        except ValueError:
            return json.dumps(raw, ensure_ascii=False)

    def _piece(self, arguments: str) -> ToolCallDelta:
        call = self._calls[-1]
        call.arguments += arguments
        return ToolCallDelta(index=len(self._calls) - 1, arguments=arguments)
