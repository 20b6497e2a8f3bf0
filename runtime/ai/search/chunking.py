"""A document's Markdown cut into chunks of about `chunk_size` tokens, each overlapping the one
before by `chunk_overlap` percent of that, as AI Search chunks (its defaults: 256 tokens, 10%).

Tokens are counted as a BPE tokenizer counts English closely enough for sizing: a word is one token
per 4 characters of it (at least one), a punctuation mark one. A cut prefers the end of a paragraph
or a sentence within the last quarter of the window, and a heading always starts a new chunk when
the chunk so far holds at least a quarter of the size, so that a chunk reads as a passage. Each
chunk carries its `context`: the document's title and the headings above it, which the keyword
index and the embedding read beside the text (a passage that never repeats its subject's name is
still found by it), while the chunk's `text` is returned as it stands in the document.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_SIZE, MIN_SIZE, MAX_SIZE = 256, 64, 2048
DEFAULT_OVERLAP, MAX_OVERLAP = 10, 30  # percent
_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t#]*$", re.MULTILINE)


@dataclass(frozen=True)
class Chunk:
    seq: int
    text: str
    context: str  # title > heading > subheading, for retrieval only


def token_spans(text: str) -> list[tuple[int, int, int]]:
    """(start, end, tokens) of each word or mark: a long word counts a token per 4 characters."""
    return [(m.start(), m.end(), max(1, (m.end() - m.start() + 3) // 4)) for m in _TOKEN.finditer(text)]


def count_tokens(text: str) -> int:
    return sum(t for _, _, t in token_spans(text))


def _headings(text: str) -> list[tuple[int, int, str]]:
    return [(m.start(), len(m.group(1)), m.group(2).strip()) for m in _HEADING.finditer(text)]


def _context_at(headings: list[tuple[int, int, str]], pos: int, title: str) -> str:
    path: list[tuple[int, str]] = []
    for start, level, name in headings:
        if start > pos:
            break
        path = [p for p in path if p[0] < level] + [(level, name)]
    names = [name for _, name in path]
    if title and (not names or names[0] != title):
        names.insert(0, title)
    return " > ".join(names)


def _good_cut(text: str, spans: list[tuple[int, int, int]], lo: int, hi: int) -> int:
    """The index (exclusive) of the last token in spans[lo:hi] that ends a paragraph or a sentence,
    else hi."""
    for i in range(hi - 1, lo - 1, -1):
        end = spans[i][1]
        follow = text[end : end + 2]
        if follow.startswith("\n\n") or (
            text[spans[i][0] : end] in ".!?" and (follow[:1] in (" ", "\n", ""))
        ):
            return i + 1
    return hi


def chunk_markdown(
    text: str, size: int = DEFAULT_SIZE, overlap_percent: int = DEFAULT_OVERLAP, title: str = ""
) -> list[Chunk]:
    spans = token_spans(text)
    if not spans:
        return []
    overlap = size * overlap_percent // 100
    headings = _headings(text)
    heading_starts = {start for start, _, _ in headings}
    # a heading's first token (its '#'): a chunk ends before it once it is a quarter full
    breaks = {i for i, (s, _, _) in enumerate(spans) if s in heading_starts}
    chunks: list[Chunk] = []
    start = 0
    while start < len(spans):
        used, end = 0, start
        while end < len(spans) and used + spans[end][2] <= size:
            if end > start and end in breaks and used >= size // 4:
                break
            used += spans[end][2]
            end += 1
        end = max(end, start + 1)
        if end < len(spans) and end not in breaks:
            end = _good_cut(text, spans, start + max(1, (end - start) * 3 // 4), end)
        piece = text[spans[start][0] : spans[end - 1][1]].strip()
        if piece:
            chunks.append(Chunk(len(chunks), piece, _context_at(headings, spans[start][0], title)))
        if end >= len(spans):
            break
        back, tokens = end, 0
        while back > start + 1 and tokens + spans[back - 1][2] <= overlap and back - 1 not in breaks:
            back -= 1
            tokens += spans[back][2]
        # the overlap starts at a sentence where one starts inside it
        for i in range(back, end):
            if i > back and text[spans[i - 1][0] : spans[i - 1][1]] in ".!?\n":
                back = i
                break
        start = back if end not in breaks else end
    return chunks


def title_of(markdown: str, key: str) -> str:
    """The document's title: its first heading, else its file name without extension."""
    for _, _, name in _headings(markdown)[:1]:
        return name
    base = key.rsplit("/", 1)[-1]
    return base.rsplit(".", 1)[0] if "." in base else base
