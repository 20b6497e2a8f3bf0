"""The streaming parser of a model's tool-call format (engine.structured.tool_calls): text deltas in, content
and OpenAI-shaped tool calls out.

Markup never reaches the content, nor a call's arguments: a delta that ends inside what may be a
marker is held back until the next delta says whether it is one, and a marker inside the arguments
counts only outside their JSON strings. A call goes out whole, as one piece carrying its id, name
and arguments, once it has ended and its arguments were checked: a JSON object, for a declared
function the choice allows (one call only when parallel calls are off), and where the tool is
`strict`, valid for its schema. So the pieces streamed join to exactly the calls `finish` returns:
a call cut off (max_tokens) or failing those checks is dropped, never streamed in part; `complete`
says whether a call was left unfinished, `rejected` counts those that failed the checks. GLM-4.5
writes arguments as key/value pairs; its calls' arguments are that object's JSON (a string-typed
argument a string, any other the JSON it was written in).
"""

from __future__ import annotations

import json
import logging
import uuid
from typing import Any

from engine.structured import tool_calls as fmts
from engine.structured.tool_schema import check
from engine.structured.tool_types import ToolCall, ToolCallDelta, ToolFunction

log = logging.getLogger(__name__)
MAX_HEAD_CHARS = 256  # a call's name part longer than this is not a call: the text goes out as content
MAX_ARGUMENT_CHARS = 1 << 20  # a call's arguments longer than this are dropped, not held


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def _held(text: str, markers: tuple[str, ...]) -> int:
    """How many characters at the end of `text` may be the start of one of `markers`."""
    for n in range(min(len(text), max(map(len, markers)) - 1), 0, -1):
        if any(m.startswith(text[-n:]) for m in markers):
            return n
    return 0


class _Scan:
    """Finds a marker outside JSON strings, across deltas: a string may hold the marker's text."""

    def __init__(self, json_text: bool):
        self.json = json_text  # False: raw text, where the first occurrence counts
        self.pos = 0  # how far the buffer was read
        self.in_string = False
        self.escaped = False

    def find(self, buf: str, marker: str) -> int:
        """Where `marker` begins in `buf` (outside strings), or -1 (read on from there next time)."""
        if not self.json:
            at = buf.find(marker, max(0, self.pos - len(marker) + 1))
            self.pos = len(buf) if at < 0 else at
            return at
        i = self.pos
        while i < len(buf):
            c = buf[i]
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif c == "\\":
                    self.escaped = True
                elif c == '"':
                    self.in_string = False
            elif c == "<":
                if buf.startswith(marker, i):
                    self.pos = i
                    return i
                if marker.startswith(buf[i:]):  # a marker's start at the end: wait for more
                    break
            elif c == '"':
                self.in_string = True
            i += 1
        self.pos = i
        return -1


class _Open:
    """The call being written."""

    def __init__(self, name: str):
        self.name = name
        self.text = ""  # Kimi K2: its arguments' text
        self.pairs: dict[str, Any] = {}  # GLM-4.5: its arguments
        self.key = ""
        self.bad = ""  # why it is not the format (it is dropped at its end)


class ToolCallParser:
    """feed(text) -> (content, pieces); flush() at the end of the output; finish() -> (the whole
    content, the calls). `tools` (when known) are the functions that may be called (and say which
    GLM-4.5 arguments are strings); `tool_choice` a function's name allows that one only;
    `parallel` False keeps the first call only."""

    def __init__(
        self,
        fmt: str,
        tools: list[ToolFunction] | None = None,
        tool_choice: str = "auto",
        parallel: bool = True,
    ):
        if fmt not in (fmts.KIMI_K2, fmts.GLM45):
            raise ValueError(f"no tool-call format {fmt!r}")
        self.fmt = fmt
        self._tools = {t.name: t for t in tools or []}
        self._known = tools is not None
        self._choice = tool_choice
        self._parallel = parallel
        self._raw = {t.name: set(fmts.glm_raw_keys(t)) for t in tools or []}
        self._declared = {t.name: set(t.parameters.get("properties") or {}) for t in tools or []}
        self._buf = ""
        self._state = "text"
        self._after_call = False  # GLM-4.5: whitespace between calls is not content
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._open: _Open | None = None
        self._scan = _Scan(True)
        self._raw_value: bool | None = None  # GLM-4.5: the open value is raw text (None: unknown)
        self.complete = True  # every call started has ended
        self.rejected = 0  # calls dropped for failing the checks

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
        """The end of the output: held-back text goes out as content; a call not ended is dropped
        (and what was held back inside the markup with it: nothing a client can use)."""
        rest, self._buf = self._buf, ""
        if self._state == "text" and not self._after_call:
            self._content.append(rest)
            return rest, []
        if self._state == "text" or self._state == "section":
            # after a call: the start of another one cut off (its marker's start) is no call; the
            # section's end cut off leaves the calls before it whole
            ending = self.fmt == fmts.KIMI_K2 and fmts.KIMI_SECTION_END.startswith(rest.strip())
            if rest.strip() and not ending:
                self.complete = False
            return "", []
        self._open, self.complete = None, False
        return "", []

    def finish(self) -> tuple[str, list[ToolCall]]:
        return "".join(self._content), list(self._calls)

    # --- the states ---

    def _step(self, content: list[str], pieces: list[ToolCallDelta]) -> bool:
        """Consume what the buffer allows in the current state; whether to go on."""
        state = self._state
        if state == "text":
            return self._text(content)
        if state == "section":
            return self._section()
        if state == "head":
            return self._head()
        if state == "args":
            return self._kimi_args(pieces)
        if state == "pairs":
            return self._glm_pairs(content, pieces)
        if state == "key":
            return self._glm_key()
        return self._glm_value()

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

    def _section(self) -> bool:
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

    def _head(self) -> bool:
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
        self._open, self.complete = _Open(name), False
        self._state = "args" if self.fmt == fmts.KIMI_K2 else "pairs"
        self._scan = _Scan(True)
        return True

    def _kimi_args(self, pieces: list[ToolCallDelta]) -> bool:
        at = self._scan.find(self._buf, fmts.KIMI_CALL_END)
        if at < 0:
            if len(self._buf) > MAX_ARGUMENT_CHARS:
                self._open.bad = "arguments too long"
                self._scan = _Scan(False)  # (then only the end marker is looked for)
            return False
        self._open.text = self._buf[:at]
        self._buf = self._buf[at + len(fmts.KIMI_CALL_END) :]
        self._state = "section"
        self._end_call(self._open.text, pieces)
        return True

    def _glm_pairs(self, content: list[str], pieces: list[ToolCallDelta]) -> bool:
        self._buf = self._buf.lstrip()
        if self._buf.startswith(fmts.GLM_CALL_END):
            self._buf = self._buf[len(fmts.GLM_CALL_END) :]
            self._state, self._after_call = "text", True
            self._end_call(json.dumps(self._open.pairs, ensure_ascii=False), pieces)
            return True
        if self._buf.startswith(fmts.GLM_KEY_BEGIN):
            self._buf, self._state = self._buf[len(fmts.GLM_KEY_BEGIN) :], "key"
            return True
        if any(m.startswith(self._buf) for m in (fmts.GLM_KEY_BEGIN, fmts.GLM_CALL_END)):
            return False  # not enough yet to tell
        self._drop_open("not the format")  # the rest is content
        self._state = "text"
        return True

    def _glm_key(self) -> bool:
        at = self._buf.find(fmts.GLM_KEY_END)
        if at < 0:
            if len(self._buf) > MAX_HEAD_CHARS:
                self._drop_open("a key too long")
                self._state = "text"
                return True
            return False
        after = self._buf[at + len(fmts.GLM_KEY_END) :].lstrip()
        if not after.startswith(fmts.GLM_VALUE_BEGIN):
            if fmts.GLM_VALUE_BEGIN.startswith(after):
                return False  # not enough yet to tell
            self._drop_open("a key without a value")
            self._state = "text"
            return True
        key = self._buf[:at].strip()
        self._open.key, self._buf = key, after[len(fmts.GLM_VALUE_BEGIN) :]
        raw = self._raw.get(self._open.name)
        if raw is None:  # an unknown function (or tools not given): JSON where it reads as JSON
            raw_value = None
        else:
            raw_value = key in raw or (key not in self._declared[self._open.name] and "*" in raw)
        self._scan = _Scan(raw_value is False)  # (a marker inside a JSON string is text)
        self._raw_value = raw_value
        self._state = "value"
        return True

    def _glm_value(self) -> bool:
        at = self._scan.find(self._buf, fmts.GLM_VALUE_END)
        if at < 0:
            if len(self._buf) > MAX_ARGUMENT_CHARS:
                self._open.bad = "arguments too long"
                self._scan = _Scan(False)
            return False
        text, self._buf = self._buf[:at], self._buf[at + len(fmts.GLM_VALUE_END) :]
        self._open.pairs[self._open.key] = self._value(text)
        self._state = "pairs"
        return True

    def _value(self, raw: str) -> Any:
        if self._raw_value:
            return raw
        try:
            return json.loads(raw)
        except ValueError:
            if self._raw_value is None:  # (no schema says: a string, as GLM-4.5 writes one)
                return raw
            self._open.bad = f"argument {self._open.key!r} is not JSON"
            return raw

    # --- a call's end ---

    def _drop_open(self, why: str) -> None:
        if self._open is not None:
            log.warning("dropped a %s tool call: %s", self.fmt, why)
            self.rejected += 1
        self._open, self.complete = None, True

    def _end_call(self, arguments: str, pieces: list[ToolCallDelta]) -> None:
        call, self._open, self.complete = self._open, None, True
        why = call.bad or self._check(call.name, arguments)
        if why:
            log.warning("dropped a tool call of %r: %s", call.name, why)
            self.rejected += 1
            return
        made = ToolCall(id=call_id(), name=call.name, arguments=arguments)
        self._calls.append(made)
        pieces.append(
            ToolCallDelta(index=len(self._calls) - 1, id=made.id, name=made.name, arguments=arguments)
        )

    def _check(self, name: str, arguments: str) -> str:
        """Why a call that ended cannot be returned ("" when it can)."""
        if self._known and name not in self._tools:
            return "no such function was declared"
        if self._choice not in ("auto", "required", "none") and name != self._choice:
            return f"tool_choice names {self._choice!r}"
        if not self._parallel and self._calls:
            return "parallel_tool_calls is off: one call only"
        try:
            args = json.loads(arguments)
        except ValueError:
            return "its arguments are not JSON"
        if not isinstance(args, dict):
            return "its arguments are not a JSON object"
        tool = self._tools.get(name)
        if tool is not None and tool.strict:
            return check(args, fmts.arguments_schema(tool)) or ""
        return ""
