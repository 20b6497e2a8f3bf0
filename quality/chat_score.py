"""How `edge models eval --chat` scores one reply: pure functions of the answer text, the calls it
made and the prompt's `expect` (quality.chat_eval runs the prompts and sums these up).

Each prompt kind is judged by one rule: tool calls and JSON must equal what was expected exactly
(value for value: 1 is not 1.0 nor true); facts count as answered unless the reply says it does
not know, and as correct when an expected string occurs in it; prose is a reply no line of which
looks like code (`looks_like_code`), and a greeting or identity answer must be English too.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from typing import Any

TOOL_KINDS = ("tool", "parallel_tool")
FACT_KINDS = ("fact_seen", "fact_phrasing", "rag")
PROSE_KINDS = ("chat", "greeting", "identity")
ENGLISH_KINDS = ("greeting", "identity")
KINDS = (*TOOL_KINDS, "json", *FACT_KINDS, "fact_unknown", "docstring", *PROSE_KINDS)

# A call as scored: its name and its arguments (None when they were not a JSON object)
Call = tuple[str, Any]


def _canonical(value: Any) -> str:
    """One text per JSON value, so equality is exact: keys sorted, and 1, 1.0 and true differ."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False)


def calls_right(made: list[Call], expected: list[dict[str, Any]]) -> bool:
    """The calls made are exactly the expected ones: names and argument objects equal, in any
    order (parallel calls have none), none missing and none extra."""
    got = Counter(_canonical([name, args]) for name, args in made)
    want = Counter(_canonical([c["name"], c.get("arguments", {})]) for c in expected)
    return got == want


def parse_arguments(text: str) -> Any:
    """A call's arguments text as a JSON object, or None when it is not one."""
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def json_answer(answer: str) -> Any:
    """The JSON object an answer gives: the whole stripped answer, or else the first `{...}` in it
    that parses (json's raw_decode from each '{' in turn finds the first balanced one); None if
    there is none."""
    text = answer.strip()
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    if isinstance(whole, dict):
        return whole
    decoder = json.JSONDecoder()
    at = text.find("{")
    while at >= 0:
        try:
            return decoder.raw_decode(text, at)[0]  # from a '{': an object, if anything
        except ValueError:
            at = text.find("{", at + 1)
    return None


def json_right(answer: str, expected: dict[str, Any]) -> bool:
    value = json_answer(answer)
    return value is not None and _canonical(value) == _canonical(expected)


def says_unknown(answer: str) -> bool:
    """The reply says it does not know (a typographic apostrophe counts as one)."""
    text = answer.lower().replace("\u2019", "'")
    return "don't know" in text or "do not know" in text


def answered(answer: str) -> bool:
    """It gave an answer: something, and not that it does not know."""
    return bool(answer.strip()) and not says_unknown(answer)


def fact_correct(answer: str, any_of: list[str]) -> bool:
    text = answer.lower()
    return any(s.lower() in text for s in any_of)


def words_found(answer: str, words: list[str]) -> int:
    """How many of `words` occur as whole words (case-insensitive); a word may hold '-' or '.'."""
    return sum(
        1 for w in words if re.search(rf"(?<!\w){re.escape(w)}(?!\w)", answer, re.IGNORECASE) is not None
    )


def docstring_right(answer: str, words: list[str], least: int) -> bool:
    return words_found(answer, words) >= least


# Lines that look like code (Python mostly, what the miniatures were pretrained on). Keywords are
# matched lowercase only, so an English sentence that begins "Return the..." or "For example:" is prose.
_CODE_START = re.compile(
    r"(def|class)\s+\w"  # a definition
    r"|import\s+\w|from\s+\S+\s+import\b"  # an import
    r"|return\b"  # a return statement
    r"|@\w"  # a decorator
    r"|>>>"  # a doctest or REPL prompt
    r"|```"  # a fenced code block
)
_BLOCK_START = re.compile(r"(if|for|while|with|try|elif|else)\b")  # ... a line that ends in ':'


def looks_like_code(line: str) -> bool:
    """One line of a reply that looks like code rather than prose: it starts with a definition,
    import, return, decorator, `>>>` or a code fence; it is a block header (starts with
    if/for/while/with/try/elif/else and ends in ':'); it assigns (` = ` beside a call's '(' or
    `self.`); it compares with `==`; it ends with ';'; or it is indented 4 spaces (or a tab) or more."""
    if not line.strip():
        return False
    if line.startswith(("    ", "\t")):
        return True
    text = line.strip()
    if _CODE_START.match(text) or (text.endswith(":") and _BLOCK_START.match(text)):
        return True
    if " = " in text and ("(" in text or "self." in text):
        return True
    return "==" in text or text.endswith(";")


def is_prose(answer: str) -> bool:
    """Something was said, and no line of it looks like code."""
    return bool(answer.strip()) and not any(looks_like_code(line) for line in answer.splitlines())


COMMON_WORDS = frozenset("i you the a am is are can help hello hi how what my me to of and model".split())


def is_english(answer: str) -> bool:
    """At least 90% of its letters are ASCII and at least two different common English words occur."""
    letters = [c for c in answer if c.isalpha()]
    if not letters or sum(c.isascii() for c in letters) < 0.9 * len(letters):
        return False
    return len(COMMON_WORDS & set(re.findall(r"[a-z]+", answer.lower()))) >= 2


def right(kind: str, expect: dict[str, Any], answer: str, calls: list[Call]) -> bool:
    """Whether a reply is right for its kind ("correct" for a fact, "prose" for chat; a greeting or
    identity answer must be English prose)."""
    if kind in TOOL_KINDS:
        return calls_right(calls, expect["calls"])
    if kind == "json":
        return json_right(answer, expect["object"])
    if kind in FACT_KINDS:
        return fact_correct(answer, expect["any"])
    if kind == "fact_unknown":
        return says_unknown(answer)
    if kind == "docstring":
        return docstring_right(answer, expect["words"], expect["min"])
    if kind in ENGLISH_KINDS:
        return is_prose(answer) and is_english(answer)
    if kind in PROSE_KINDS:
        return is_prose(answer)
    raise ValueError(f"unknown prompt kind {kind!r} (known: {', '.join(KINDS)})")
