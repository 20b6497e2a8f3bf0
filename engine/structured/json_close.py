"""The shortest text that closes a JSON object cut off anywhere, tracked byte by byte as a sequence
generates it: what JSON mode forces once the token budget left is only just enough to close.

Why: any-JSON mode ({"type": "json_object"}) bounds nothing, so a sampled answer can wander (inside
a key, down nested arrays) until max_tokens cuts the object and the client gets invalid JSON. A
grammar cannot see the budget; this can. The text is the compact JSON llguidance generates with
engine.structured.guide.JSON_OPTIONS (", " and ": " separators, no other whitespace), and what it closes with
is always valid there: a string's end (completing an escape or a UTF-8 character first), a number's
missing digit, the rest of a literal, `: 0` after a key, `"": 0` after an object's comma, `0` after
an array's, then each open bracket's closer.
"""

from __future__ import annotations

import copy
import json

# what may follow, by state
START, KEY_OR_END, KEY, COLON, COLON_SPACE, VALUE_OR_END, VALUE, AFTER_VALUE, COMMA_SPACE = range(9)
STRING, ESCAPE, UNICODE, NUMBER, LITERAL, DONE = range(9, 15)
LITERALS = {ord("t"): b"true", ord("f"): b"false", ord("n"): b"null"}
DIGITS = frozenset(b"0123456789")


class JsonCloser:
    """Feed it the object's bytes as they are generated; `suffix()` is what closes it. A byte it did
    not expect (the text is not the compact JSON it models) makes it `lost`: it then closes nothing,
    and the grammar alone decides. `any_value`: the text is any JSON value, not only an object (a
    GLM-4.5 tool argument); a number at the top level then ends only with what follows it, which
    is not fed here (`done` says whether the value is whole)."""

    def __init__(self, any_value: bool = False) -> None:
        self.any_value = any_value
        self.stack = bytearray()  # open brackets, outermost first
        self.state = VALUE if any_value else START
        self.in_key = False  # the open string is an object's key
        self.hex_left = 0  # \\u digits still to come
        self.utf8_left = 0  # continuation bytes the open character still needs
        self.utf8_lead = 0  # that character's first byte (it bounds the second)
        self.number = bytearray()  # the open number's text
        self.literal = b""  # the rest of the open literal
        self.lost = False

    @property
    def depth(self) -> int:
        return len(self.stack)

    @property
    def done(self) -> bool:
        """The value is whole (a top-level number may still grow: it counts as whole)."""
        return self.state == DONE or (self.state == NUMBER and not self.stack and self.suffix() == b"")

    def feed(self, data: bytes) -> None:
        for byte in data:
            if self.lost:
                return
            self._byte(byte)

    def _byte(self, b: int) -> None:
        s = self.state
        if s == STRING:
            self._string_byte(b)
        elif s == ESCAPE:
            self.state, self.hex_left = (UNICODE, 4) if b == ord("u") else (STRING, 0)
        elif s == UNICODE:
            self.hex_left -= 1
            if self.hex_left == 0:
                self.state = STRING
        elif s == NUMBER:
            if b in DIGITS or b in b".eE+-":
                self.number.append(b)
            elif not self.stack:  # a top-level number ends with what follows it: not JSON's
                self.lost = True
            else:
                self.state = AFTER_VALUE
                self._byte(b)
        elif s == LITERAL:
            if not self.literal or b != self.literal[0]:
                self.lost = True
            self.literal = self.literal[1:]
            if not self.literal:
                self._after_value()
        elif s == START:
            self._expect(b, ord("{"), KEY_OR_END, push=True)
        elif s in (KEY_OR_END, KEY):
            if b == ord('"'):
                self.state, self.in_key = STRING, True
            elif b == ord("}") and s == KEY_OR_END:
                self._close(b)
            else:
                self.lost = True
        elif s == COLON:
            self._expect(b, ord(":"), COLON_SPACE)
        elif s == COLON_SPACE:
            self._expect(b, ord(" "), VALUE)
        elif s in (VALUE, VALUE_OR_END):
            if b == ord("]") and s == VALUE_OR_END:
                self._close(b)
            else:
                self._value_start(b)
        elif s == AFTER_VALUE:
            if b == ord(","):
                self.state = COMMA_SPACE
            elif b in b"}]":
                self._close(b)
            else:
                self.lost = True
        elif s == COMMA_SPACE:
            self._expect(b, ord(" "), KEY if self.stack[-1] == ord("{") else VALUE)
        else:  # DONE: nothing may follow the object
            self.lost = True

    def _string_byte(self, b: int) -> None:
        if self.utf8_left:
            self.utf8_left -= 1
        elif b == ord("\\"):
            self.state = ESCAPE
        elif b == ord('"'):
            if self.in_key:
                self.state = COLON
            else:
                self._after_value()
            self.in_key = False
        elif b >= 0xC0:
            self.utf8_lead = b
            self.utf8_left = 1 if b < 0xE0 else 2 if b < 0xF0 else 3

    def _value_start(self, b: int) -> None:
        if b in b"{[":
            self.stack.append(b)
            self.state = KEY_OR_END if b == ord("{") else VALUE_OR_END
        elif b == ord('"'):
            self.state, self.in_key = STRING, False
        elif b in DIGITS or b == ord("-"):
            self.state, self.number = NUMBER, bytearray([b])
        elif b in LITERALS:
            self.state, self.literal = LITERAL, LITERALS[b][1:]
        else:
            self.lost = True

    def _after_value(self) -> None:
        self.state = AFTER_VALUE if self.stack else DONE

    def _expect(self, b: int, want: int, then: int, push: bool = False) -> None:
        if b != want:
            self.lost = True
            return
        if push:
            self.stack.append(b)
        self.state = then

    def _close(self, b: int) -> None:
        opener = ord("{") if b == ord("}") else ord("[")
        if not self.stack or self.stack[-1] != opener:
            self.lost = True
            return
        self.stack.pop()
        self.state = AFTER_VALUE if self.stack else DONE

    def suffix(self) -> bytes | None:
        """The bytes that close the object from here (b"" once it is closed); None when lost."""
        if self.lost:
            return None
        s, out = self.state, bytearray()
        if s == START:
            return b"{}"
        if s in (STRING, ESCAPE, UNICODE):
            out += self._string_end()
            s = COLON if self.in_key else AFTER_VALUE if self.stack else DONE
        elif s == NUMBER:
            if self.number[-1:] in (b"-", b".", b"e", b"E", b"+"):
                out += b"0"
            s = AFTER_VALUE if self.stack else DONE
        elif s == LITERAL:
            out += self.literal
            s = AFTER_VALUE if self.stack else DONE
        out += {KEY: b'"": 0', COLON: b": 0", COLON_SPACE: b" 0", VALUE: b"0"}.get(s, b"")
        if s == COMMA_SPACE:
            out += b' "": 0' if self.stack[-1] == ord("{") else b" 0"
        out += bytes(ord("}") if c == ord("{") else ord("]") for c in reversed(self.stack))
        return bytes(out)

    def _string_end(self) -> bytes:
        """What ends the open string validly: the rest of a UTF-8 character or an escape, a quote."""
        out = bytearray()
        if self.state == ESCAPE:
            out += b"n"
        elif self.state == UNICODE:
            out += b"0" * self.hex_left
        elif self.utf8_left:
            # the lowest continuation bytes the lead allows (E0 needs A0+, F0 needs 90+), once
            # no continuation byte has come yet; after one, plain 0x80 bytes finish it
            need = 1 if self.utf8_lead < 0xE0 else 2 if self.utf8_lead < 0xF0 else 3
            first = {0xE0: 0xA0, 0xF0: 0x90}.get(self.utf8_lead, 0x80) if self.utf8_left == need else 0x80
            out += bytes([first] + [0x80] * (self.utf8_left - 1))
        return bytes(out) + b'"'


class JsonTracker:
    """A JsonCloser read as a closing plan reads a tool call's tracker (engine.structured.tool_close
    .CallTracker; GuideState plans either the same way): for JSON held to a schema, whose closing
    the closer alone cannot know (a required key not yet written, a string where it would write
    `0`, no `"": 0` where additionalProperties is false). Its hints are the closer's suffix and then
    each of the top-level object's `keys` (required ones first) as the next one to write; the
    grammar takes what it allows, and its own forced bytes and short fallbacks do the rest."""

    between = False  # (nothing follows a whole JSON value: no reserve for another to start)

    def __init__(self, keys: list[str] | None = None, closer: JsonCloser | None = None) -> None:
        self.keys = list(keys or [])
        # any value: a schema's top level need not be an object
        self.closer = closer if closer is not None else JsonCloser(any_value=True)
        self.key_typed = bytearray()  # the open top-level key's bytes so far

    @property
    def lost(self) -> bool:
        return self.closer.lost

    @lost.setter
    def lost(self, value: bool) -> None:
        self.closer.lost = value

    @property
    def version(self) -> tuple:
        """Moves whenever the closing may have changed: a bracket, a key, a value begun or ended
        (not a string's or a number's bytes)."""
        c = self.closer
        return (c.state, bytes(c.stack), c.in_key, c.lost, c.literal)

    def copy(self) -> JsonTracker:
        out = JsonTracker(self.keys, copy.deepcopy(self.closer))
        out.key_typed = bytearray(self.key_typed)
        return out

    def feed(self, data: bytes) -> None:
        for byte in data:
            c = self.closer
            at_key = c.state in (STRING, ESCAPE, UNICODE) and c.in_key and c.depth == 1
            c.feed(bytes([byte]))
            if not (c.state in (STRING, ESCAPE, UNICODE) and c.in_key and c.depth == 1):
                self.key_typed.clear()
            elif at_key:
                self.key_typed.append(byte)

    def hints(self) -> list[bytes]:
        c = self.closer
        suffix = c.suffix()
        first = [suffix] if suffix else []
        if c.lost or c.depth != 1 or not self.keys:
            return first
        if c.state in (KEY_OR_END, KEY):
            return first + [json.dumps(k).encode() + b": " for k in self.keys]
        if c.state == AFTER_VALUE:
            return first + [b", " + json.dumps(k).encode() + b": " for k in self.keys]
        if c.state == STRING and c.in_key:
            typed = self.key_typed.decode(errors="replace")
            rest = [
                json.dumps(k)[1 + len(typed) :].encode() + b": " for k in self.keys if k.startswith(typed)
            ]
            return first + rest
        return first
