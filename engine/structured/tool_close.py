"""Closing a tool call within the token budget: where a reply in a model's tool-call format
(engine.structured.tool_calls) stands, byte by byte, and the text that most likely closes it from there.

A grammar cannot see max_tokens, and a call cut off is no call at all (the client gets
finish_reason "length" and no call). So, as any-JSON mode does with engine.structured.json_close, a guided
sequence that may call tools plans its closing (GuideState in engine.structured.guided): the matcher's own
forced bytes first, then this tracker's `hint` (the rest of the marker being written, the JSON
arguments' closing text, the call's and the section's end markers), then the first of a few short
fallbacks the grammar allows; once only that plan still fits in the budget, its tokens are forced.

The tracker knows the markup (both formats), not the schemas: where a schema wants more (a required
key not yet written, an enum's value), the grammar refuses the hint and its forced bytes or a
fallback take over. `between` says a call has just ended and another may begin: a new call is only
let start when the budget holds one more whole call (GuideState keeps that reserve).
"""

from __future__ import annotations

import copy
import json

from engine.structured import json_close as jc
from engine.structured import tool_calls as fmts
from engine.structured.json_close import JsonCloser

KIMI_K2, GLM45 = fmts.KIMI_K2, fmts.GLM45
# the formats' markers, as bytes
SECTION_BEGIN, SECTION_END = fmts.KIMI_SECTION_BEGIN.encode(), fmts.KIMI_SECTION_END.encode()
CALL_BEGIN, ARGS_BEGIN, CALL_END = (
    m.encode() for m in (fmts.KIMI_CALL_BEGIN, fmts.KIMI_ARGS_BEGIN, fmts.KIMI_CALL_END)
)
GLM_CALL_BEGIN, GLM_CALL_END = fmts.GLM_CALL_BEGIN.encode(), fmts.GLM_CALL_END.encode()
GLM_KEY_BEGIN, GLM_KEY_END = fmts.GLM_KEY_BEGIN.encode(), fmts.GLM_KEY_END.encode()
GLM_VALUE_BEGIN, GLM_VALUE_END = fmts.GLM_VALUE_BEGIN.encode(), fmts.GLM_VALUE_END.encode()
GLM_VALUE_OPEN = GLM_KEY_END + b"\n" + GLM_VALUE_BEGIN
GLM_NEXT_CALL = b"\n" + GLM_CALL_BEGIN

MAX_HEAD = 256  # a call's name part (and a GLM key) longer than this is not the format: lost

# states
TEXT, SECTION, HEAD, ARGS, CALL_TAIL, END = range(6)  # Kimi K2 (and GLM's TEXT, HEAD)
PAIRS, KEY, VALUE_RAW, VALUE_JSON, VALUE_TAIL, BETWEEN = range(6, 12)  # GLM-4.5


def _rest(marker: bytes, written: bytes) -> bytes:
    """What completes `marker` when `written` ends with its start (all of it when it does not)."""
    for n in range(min(len(marker), len(written)), 0, -1):
        if written.endswith(marker[:n]):
            return marker[n:]
    return marker


class CallTracker:
    """Feed it the reply's bytes; `hint()` is a likely closing text from here (b"" when none is
    needed or known), `between` whether a call has just ended, `version` a count that moves
    whenever the closing may have changed (a marker, a bracket, a key: not a string's bytes).

    `names`: the callable functions; `keys`: per function, its declared argument names (required
    ones first: the order hints try them in); `raw`:
    per function, the GLM-4.5 arguments written as raw text (the rest are JSON), with "*" in it
    when undeclared arguments are raw too; `opened`: the reply must start with the calls (tool_choice
    "required" or a named function) rather than may write text first."""

    def __init__(
        self,
        fmt: str,
        names: list[str],
        keys: dict[str, list[str]] | None = None,
        raw: dict[str, list[str]] | None = None,
        opened: bool = False,
    ):
        if fmt not in (KIMI_K2, GLM45):
            raise ValueError(f"no tool-call format {fmt!r}")
        self.fmt = fmt
        self.names = sorted(names, key=len)
        self.keys = {k: list(v) for k, v in (keys or {}).items()}
        self.raw = {k: set(v) for k, v in (raw or {}).items()}
        self.opened = opened
        self.state = TEXT
        self.buf = b""  # what the current state has read (a marker's start, a name, a key)
        self.json: JsonCloser | None = None
        self.name = ""  # the open call's function
        self.key = ""  # GLM-4.5: the open argument
        self.calls = 0  # calls ended
        self.version = 0
        self.lost = False

    def copy(self) -> CallTracker:
        out = copy.copy(self)
        out.json = copy.deepcopy(self.json)
        return out

    @property
    def between(self) -> bool:
        """A call has just ended; the next bytes end the reply or begin another call."""
        if self.lost or self.buf:
            return False
        return (self.state == SECTION and self.calls > 0) or self.state == BETWEEN

    # --- feeding ---

    def feed(self, data: bytes) -> None:
        for byte in data:
            if self.lost:
                return
            before = (self.state, self.json.state if self.json else -1, self.json.depth if self.json else -1)
            self._byte(bytes([byte]))
            after = (self.state, self.json.state if self.json else -1, self.json.depth if self.json else -1)
            if after != before or self.state == HEAD:  # (a name's every byte may change what follows)
                self.version += 1

    def _go(self, state: int) -> None:
        self.state, self.buf = state, b""

    def _expect(self, b: bytes, *markers: bytes) -> bytes | None:
        """Read `b` toward one of `markers` (expected next): the one completed, or None; lost when
        what is read starts none of them."""
        self.buf += b
        for marker in markers:
            if self.buf == marker:
                return marker
        if not any(m.startswith(self.buf) for m in markers):
            self.lost = True
        return None

    def _byte(self, b: bytes) -> None:
        s = self.state
        if s == TEXT:
            opener = SECTION_BEGIN if self.fmt == KIMI_K2 else GLM_CALL_BEGIN
            self.buf = (self.buf + b)[-len(opener) :]
            if self.buf == opener:
                self._go(SECTION if self.fmt == KIMI_K2 else HEAD)
        elif s == SECTION:
            got = self._expect(b, CALL_BEGIN, SECTION_END)
            if got is not None:
                self._go(HEAD if got == CALL_BEGIN else END)
        elif s == HEAD:
            self._head(b)
        elif s in (ARGS, VALUE_JSON):
            closer = self.json
            if s == VALUE_JSON and closer.state == jc.NUMBER and not closer.stack and b == b"<":
                # a top-level number ends with the marker after it (the closer reads JSON only)
                if not closer.done:
                    self.lost = True
                    return
                self._go(VALUE_TAIL)
                self._byte(b)
                return
            in_key = closer.in_key and closer.state in (jc.STRING, jc.ESCAPE, jc.UNICODE)
            closer.feed(b)
            if closer.in_key and closer.state in (jc.STRING, jc.ESCAPE, jc.UNICODE):
                self.buf = self.buf + b if in_key else b""  # the key being written
            if closer.lost:
                self.lost = True
            elif closer.state == jc.DONE:
                self._go(CALL_TAIL if s == ARGS else VALUE_TAIL)
        elif s == CALL_TAIL:
            if self._expect(b, CALL_END) is not None:
                self.calls += 1
                self._go(SECTION)
        elif s == END:
            self.lost = True  # nothing may follow the section
        elif s == PAIRS:
            got = self._expect(b, GLM_KEY_BEGIN, GLM_CALL_END)
            if got == GLM_KEY_BEGIN:
                self._go(KEY)
            elif got == GLM_CALL_END:
                self.calls += 1
                self._go(BETWEEN)
        elif s == KEY:
            self._key(b)
        elif s == VALUE_RAW:
            self.buf = (self.buf + b)[-len(GLM_VALUE_END) :]
            if self.buf == GLM_VALUE_END:
                self._go(VALUE_TAIL)
                self.buf = GLM_VALUE_END
        elif s == VALUE_TAIL:
            if self._expect(b, GLM_VALUE_END + b"\n") is not None:
                self._go(PAIRS)
        elif s == BETWEEN:
            if self._expect(b, GLM_NEXT_CALL) is not None:
                self._go(HEAD)

    def _head(self, b: bytes) -> None:
        self.buf += b
        if self.fmt == KIMI_K2:
            if self.buf.endswith(ARGS_BEGIN):
                head = self.buf[: -len(ARGS_BEGIN)].decode(errors="replace")
                self.name = head.removeprefix("functions.").rsplit(":", 1)[0]
                self._go(ARGS)
                self.json = JsonCloser()
        elif b == b"\n":
            self.name = self.buf[:-1].decode(errors="replace").strip()
            self._go(PAIRS)
        if len(self.buf) > MAX_HEAD:
            self.lost = True

    def _key(self, b: bytes) -> None:
        self.buf += b
        if self.buf.endswith(GLM_VALUE_OPEN):
            self.key = self.buf[: -len(GLM_VALUE_OPEN)].decode(errors="replace").strip()
            raw = self.raw.get(self.name, set())
            declared = self.key in self.keys.get(self.name, [])
            if self.key in raw or (not declared and "*" in raw):
                self._go(VALUE_RAW)
            else:
                self._go(VALUE_JSON)
                self.json = JsonCloser(any_value=True)
        elif len(self.buf) > MAX_HEAD + len(GLM_VALUE_OPEN):
            self.lost = True

    # --- the closing ---

    def hints(self) -> list[bytes]:
        """`hint()`, then other ways on where the grammar may refuse it: writing each declared
        argument next (an object's required keys refuse its end)."""
        first = self.hint()
        keys = self.keys.get(self.name, [])
        if self.lost or not keys:
            return [first]
        s, buf = self.state, self.buf
        if self.fmt == KIMI_K2 and s == ARGS and self.json.depth == 1:
            state = self.json.state
            if state in (jc.KEY_OR_END, jc.KEY):
                return [first, *(json.dumps(k).encode() + b": " for k in keys)]
            if state == jc.AFTER_VALUE:
                return [first, *(b", " + json.dumps(k).encode() + b": " for k in keys)]
            if state == jc.STRING and self.json.in_key:
                typed = buf.decode(errors="replace")
                return [
                    first,
                    *(json.dumps(k)[1 + len(typed) :].encode() + b": " for k in keys if k.startswith(typed)),
                ]
        if self.fmt == GLM45 and s == PAIRS and GLM_KEY_BEGIN.startswith(buf):
            rest = GLM_KEY_BEGIN[len(buf) :]
            return [first, *(rest + k.encode() + GLM_VALUE_OPEN for k in keys)]
        if self.fmt == GLM45 and s == KEY:
            typed = buf.decode(errors="replace")
            return [first, *(k[len(typed) :].encode() + GLM_VALUE_OPEN for k in keys if k.startswith(typed))]
        return [first]

    def hint(self) -> bytes:
        """A likely closing text from here (it may stop short of the end where only the grammar
        knows what follows: a name or a key among several, the arguments a schema requires)."""
        if self.lost:
            return b""
        return self._kimi_hint() if self.fmt == KIMI_K2 else self._glm_hint()

    def _completed_name(self, prefix: str, after: str) -> bytes:
        """The rest of the shortest function name that starts with `prefix`, then `after`."""
        for name in self.names:
            if name.startswith(prefix):
                return (name[len(prefix) :] + after).encode()
        return b""

    def _kimi_hint(self) -> bytes:
        s, buf = self.state, self.buf
        if s == TEXT:
            return _rest(SECTION_BEGIN, buf) + CALL_BEGIN if self.opened else b""
        if s == SECTION:
            if self.calls and SECTION_END.startswith(buf):
                return SECTION_END[len(buf) :]
            return CALL_BEGIN[len(buf) :] if CALL_BEGIN.startswith(buf) else b""
        if s == HEAD:
            head = buf.decode(errors="replace")
            if not "functions.".startswith(head) and not head.startswith("functions."):
                return b""
            if head.startswith("functions.") and ":" in head:
                tail = head.rsplit(":", 1)[1]
                return (b"" if tail else b"0") + _rest(ARGS_BEGIN, buf)
            if len(head) < len("functions."):
                return ("functions."[len(head) :]).encode() + self._completed_name("", ":0") + ARGS_BEGIN
            return self._completed_name(head.removeprefix("functions."), ":0") + ARGS_BEGIN
        if s == ARGS:
            return (self.json.suffix() or b"") + CALL_END + SECTION_END
        if s == CALL_TAIL:
            return CALL_END[len(buf) :] + SECTION_END
        return b""

    def _glm_hint(self) -> bytes:
        s, buf = self.state, self.buf
        if s == TEXT:
            return _rest(GLM_CALL_BEGIN, buf) if self.opened else b""
        if s == HEAD:
            return self._completed_name(buf.decode(errors="replace"), "\n")
        if s == PAIRS:
            if GLM_CALL_END.startswith(buf):
                return GLM_CALL_END[len(buf) :]
            return GLM_KEY_BEGIN[len(buf) :] if GLM_KEY_BEGIN.startswith(buf) else b""
        if s == KEY:
            typed = buf.decode(errors="replace")
            for key in self.keys.get(self.name, []):
                if key.startswith(typed):
                    return (key[len(typed) :]).encode() + _rest(GLM_VALUE_OPEN, buf)
            return _rest(GLM_VALUE_OPEN, buf) if typed else b""
        if s == VALUE_RAW:
            return _rest(GLM_VALUE_END, buf) + b"\n" + GLM_CALL_END
        if s == VALUE_JSON:
            return (self.json.suffix() or b"") + GLM_VALUE_END + b"\n" + GLM_CALL_END
        if s == VALUE_TAIL:
            return (GLM_VALUE_END + b"\n")[len(buf) :] + GLM_CALL_END
        if s == BETWEEN and buf:
            return GLM_NEXT_CALL[len(buf) :]  # (committed to another call: its name comes next)
        return b""

    def next_call(self, name: str) -> bytes:
        """What begins another call, of function `name`, from `between` (up to its arguments)."""
        if self.fmt == KIMI_K2:
            return CALL_BEGIN + f"functions.{name}:0".encode() + ARGS_BEGIN
        return GLM_NEXT_CALL + name.encode() + b"\n"
