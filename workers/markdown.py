"""`env.AI.toMarkdown(files)`: documents to Markdown, as Cloudflare's Markdown Conversion answers
(`[{name, mimeType, format: "markdown", tokens, data}]`, or `format: "error"` with `error` for a
file it cannot convert). HTML, plain text, Markdown and CSV are converted, with the standard
library only; PDF, images and office documents need converters this runtime does not ship, so
each such file answers an error that says what is supported.

It runs in the isolate: it needs no state of the runtime's, and its CPU time is the worker's, held
by the worker's own limits. MAX_BYTES bounds a file.

Any file a tenant sends is converted in time and memory linear in its size, and the Markdown is at
most GROWTH times the file's bytes plus SLACK, whatever the file: Markdown repeats a block quote's
`> ` and a list's indent on every line, so nesting is rendered at most MAX_DEPTH deep, and deeper
only while the output stays within that bound (quotes, indents and links past it are flattened);
a CSV table is at most MAX_COLUMNS wide, and its short rows are padded only while the bound allows
(a Markdown table fills a short row's missing cells itself). A result that was flattened says so
in `note`, a key Cloudflare's result does not have (absent when nothing was)."""

from __future__ import annotations

import csv
import io
import re
from collections.abc import Callable, Iterator
from html import unescape
from typing import Any

MAX_BYTES = 10 * 1024 * 1024
MAX_DEPTH = 16  # block quotes, lists and links rendered nested at most this deep
MAX_COLUMNS = 64  # a CSV table's width; a wider row's cells from the last column on are joined
GROWTH, SLACK = 4, 1024  # the Markdown is at most GROWTH x the file's bytes + SLACK
SUPPORTED = {
    "text/html": (".html", ".htm"),
    "text/plain": (".txt",),
    "text/markdown": (".md", ".markdown"),
    "text/csv": (".csv",),
}
CHARS_PER_TOKEN = 4  # the estimate `tokens` reports (no tokenizer in the isolate)
_BLOCKS = {"p", "div", "section", "article", "header", "footer", "main", "nav", "aside", "table", "form"}
_HEADINGS = {f"h{n}": n for n in range(1, 7)}
_DROPPED = {"script", "style", "noscript", "template", "head", "svg", "iframe"}

_DEEP = f"nesting deeper than {MAX_DEPTH} levels (block quotes, lists, links) is flattened to {MAX_DEPTH}"
_BUDGET = f"nesting is flattened where rendering it would make the Markdown over {GROWTH}x the file's size"
_WIDE = f"rows wider than {MAX_COLUMNS} columns have their cells from column {MAX_COLUMNS} on joined into it"
_UNPADDED = (
    f"short rows are not padded to the table's width (a Markdown table fills missing cells itself), "
    f"which would make the Markdown over {GROWTH}x the file's size"
)


def mime_type_of(name: str, declared: str | None) -> str:
    """The file's type: its Blob's type when it names one, else from its name's extension."""
    if declared:
        return declared.split(";")[0].strip().lower()
    lower = name.lower()
    for mime, extensions in SUPPORTED.items():
        if lower.endswith(extensions):
            return mime
    return "application/octet-stream"


def supported() -> str:
    return ", ".join(f"{mime} ({'/'.join(ext)})" for mime, ext in SUPPORTED.items())


def convert(name: str, mime: str, data: bytes) -> dict[str, Any]:
    """One file's result, in Cloudflare's shape (and `note` when something was flattened)."""
    base = {"name": name, "mimeType": mime}
    if len(data) > MAX_BYTES:
        return {**base, "format": "error", "error": f"{name}: over {MAX_BYTES // 2**20} MiB; send less"}
    if mime not in SUPPORTED:
        return {
            **base,
            "format": "error",
            "error": f"{name}: {mime} cannot be converted here; supported: {supported()}",
        }
    text = data.decode("utf-8", "replace")
    notes: list[str] = []
    if mime == "text/html":
        markdown, notes = _html(text)
    elif mime == "text/csv":
        try:
            markdown, notes = _csv(text)
        except csv.Error as exc:  # a stray carriage return, a field past csv's own limit
            return {**base, "format": "error", "error": f"{name}: not CSV that can be read ({exc})"}
    else:
        markdown = text.strip() + "\n" if text.strip() else ""
    result = {**base, "format": "markdown", "tokens": -(-len(markdown) // CHARS_PER_TOKEN), "data": markdown}
    if notes:
        result["note"] = "; ".join(notes)
    return result


def html_to_markdown(text: str) -> str:
    return _html(text)[0]


def csv_to_markdown(text: str) -> str:
    return _csv(text)[0]


def _utf8_len(s: str) -> int:
    return len(s) if s.isascii() else len(s.encode("utf-8", "surrogatepass"))


def _collapse(text: str) -> str:
    """`" ".join(text.split())`, without a list of every word when the text is long (an object
    per word would cost several times the text's memory)."""
    if len(text) < 4096:
        return " ".join(text.split())
    return _WHITESPACE.sub(" ", text).strip()  # \s is str.isspace(), as split() splits on


_WHITESPACE = re.compile(r"\s+")


class _Out:
    """Text written in parts, joined into chunks as they pile up (millions of small strings would
    cost many times their text in memory); the last parts stay parts, for the spacing rules."""

    __slots__ = ("chunks", "parts")

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.parts: list[str] = []

    def add(self, s: str) -> None:
        parts = self.parts
        parts.append(s)
        if len(parts) >= 4096:
            self.compact()

    def compact(self) -> None:
        parts = self.parts
        self.chunks.append("".join(parts[:-3]))
        del parts[:-3]

    def tail(self, parts: int, n: int) -> str:
        """The last `n` characters of the last `parts` parts joined, without joining them (a part
        may be a whole document's text)."""
        p = self.parts
        last = p[-1] if p else ""
        if len(last) >= n or parts == 1:
            return last[-n:]
        return "".join([s[-n:] for s in p[-parts:]])[-n:]

    def pieces(self) -> list[str]:
        """Everything written, as chunks (emptied: the text is the caller's now)."""
        chunks = self.chunks
        chunks.append("".join(self.parts))
        self.chunks, self.parts = [], []
        return chunks

    def text(self) -> str:
        return "".join(self.pieces())


class _Markdown:
    """Headings, paragraphs, line breaks, links, images' alt text, lists (nested), emphasis, inline
    code and preformatted blocks, block quotes, rules and table rows; scripts, styles and the
    head dropped; the rest's text kept.

    Its output is held to GROWTH x the input read so far plus SLACK: `charged` counts the bytes
    written (or promised: a link's target, a table row's separators), and a quote's `> `s or a
    list item's indent is written only as deep as the rest allows, keeping MARGIN for what an
    element always writes (each writes at most GROWTH x its own tag's length)."""

    MARGIN = 32
    __slots__ = (
        "out", "dropping", "lists", "lists_past", "links", "links_past", "pre", "quote", "cells", "row",
        "cell", "header_row", "table_rows", "pos", "charged", "deep", "over",
    )  # fmt: skip

    def __init__(self) -> None:
        self.out = _Out()
        self.dropping = 0  # inside script / style / head ...
        self.lists: list[list[int | None]] = []  # per open list: [its next number] (None: bullets)
        self.lists_past = 0  # lists open past MAX_DEPTH: counted, their items bullets at MAX_DEPTH
        self.links: list[str | None] = []
        self.links_past = 0  # links open past MAX_DEPTH: their text kept, not linked
        self.pre = 0
        self.quote = 0
        self.cells: int | None = None  # in a table row: its cells so far (None: not in a row)
        self.row = _Out()  # the row's finished cells, rendered
        self.cell: _Out | None = None  # the cell being read
        self.header_row = False
        self.table_rows = 0
        self.pos = 0  # the characters of input read (the tokenizer sets it): each is a byte or more
        self.charged = 0
        self.deep = False  # nesting past MAX_DEPTH was flattened
        self.over = False  # nesting was flattened to keep to the bound

    # the bound --------------------------------------------------------------------------------------

    def _levels(self, wanted: int, unit: int, most: int = MAX_DEPTH) -> int:
        """How many of `wanted` nesting levels (`unit` characters each, at most `most`) are rendered."""
        levels = wanted
        if levels > most:
            levels = most
            self.deep = True
        spare = GROWTH * self.pos + SLACK - self.MARGIN - self.charged
        if levels * unit > spare:
            levels = max(0, spare // unit)
            self.over = True
        self.charged += levels * unit
        return levels

    @property
    def notes(self) -> list[str]:
        return [note for note, flag in ((_DEEP, self.deep), (_BUDGET, self.over)) if flag]

    # what to write --------------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        """Write `text`, charged as written."""
        self.charged += len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if self.cells is None:
            parts = self.out.parts
            parts.append(text)
            if len(parts) >= 4096:
                self.out.compact()
            return
        self.charged += text.count("|")  # escaped when the row is rendered
        self._put(text)

    def _put(self, text: str) -> None:
        """Write `text`, charged before (a link's target, when its tag opened)."""
        if self.cells is None:
            self.out.add(text)
            return
        if self.cell is None:  # text in a row before any cell: a cell of its own
            self._cell()
        self.cell.add(text)  # type: ignore[union-attr]

    def _block(self) -> None:
        """A block begins or ends: a blank line (once) before what follows. (The hot path of a
        file of many blocks: written out, not through _write.)"""
        if self.cells is not None:
            return
        out = self.out
        parts = out.parts
        if parts:
            last = parts[-1]
            tail = last[-2:] if len(last) >= 2 else out.tail(3, 2)
            if tail != "\n\n":
                line_end = "\n" if tail[-1:] == "\n" else "\n\n"
                self.charged += len(line_end)
                parts.append(line_end)
        if self.quote:
            self._prefix()
        if len(parts) >= 4096:
            out.compact()

    def _prefix(self) -> None:
        """A line in block quotes: its `> `s (what _levels does, written out: the hot path of a
        file of many blocks in deep quotes)."""
        quote = self.quote
        if quote > MAX_DEPTH:
            quote = MAX_DEPTH
            self.deep = True
        spare = GROWTH * self.pos + SLACK - self.MARGIN - self.charged
        if 2 * quote > spare:
            quote = max(0, spare // 2)
            self.over = True
        if quote:
            self.charged += 2 * quote
            self.out.parts.append(_QUOTES[quote])

    def _cell(self) -> None:
        """A table cell begins: the one before it is finished."""
        self._end_cell()
        self.cell = _Out()
        self.cells = (self.cells or 0) + 1
        self.charged += 9  # its " | " in the row and "--- | " in the separator below a first row

    def _end_cell(self) -> None:
        if self.cell is None:
            return
        if self.row.parts:
            self.row.add(" | ")
        self.row.add(_collapse(self.cell.text()).replace("|", "\\|"))
        self.cell = None

    # the parser's events: each tag's handler in _STARTS and _ENDS -----------------------------------

    def start(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in _DROPPED:
            self.dropping += 1
        if self.dropping:
            return
        handler = _STARTS.get(tag)
        if handler is not None:
            handler(self, tag, attrs)

    def end(self, tag: str) -> None:
        if tag in _DROPPED:
            self.dropping = max(0, self.dropping - 1)
            return
        if self.dropping:
            return
        handler = _ENDS.get(tag)
        if handler is not None:
            handler(self, tag)

    def data(self, data: str) -> None:
        if self.dropping:
            return
        if self.pre:
            self._write(data)
            return
        text = _collapse(data)
        parts = self.out.parts
        last = parts[-1] if parts else ""
        if not text:
            if data and parts and not last.endswith((" ", "\n")):
                self._write(" ")
            return
        lead = " " if data[:1].isspace() and parts and not last.endswith((" ", "\n", "[")) else ""
        trail = " " if data[-1:].isspace() else ""
        self._write(lead + text + trail)

    def _heading(self, tag: str, attrs: Any) -> None:
        self._block()
        self._write("#" * _HEADINGS[tag] + " ")

    def _a_block(self, tag: str, attrs: Any = None) -> None:
        self._block()

    def _br(self, tag: str, attrs: Any) -> None:
        self._write("  \n")

    def _hr(self, tag: str, attrs: Any) -> None:
        self._block()
        if self.cells is not None:
            self._write("---")
            return
        self._write("---\n\n")  # what the block after "---" would write, in one part
        if self.quote:
            self._prefix()

    def _list(self, tag: str, attrs: Any) -> None:
        if self.lists or self.lists_past:
            self._write("\n")
        else:
            self._block()
        if len(self.lists) < MAX_DEPTH:
            self.lists.append([1] if tag == "ol" else [None])
        else:  # kept as a count: a list per level would cost memory past any use
            self.lists_past += 1
            self.deep = True

    def _item(self, tag: str, attrs: Any) -> None:
        numbering = self.lists[-1] if self.lists and not self.lists_past else [None]
        if numbering[0] is None:
            marker = "- "
        else:
            marker = f"{numbering[0]}. "
            numbering[0] += 1
        if self.out.parts and not self.out.tail(2, 1) == "\n":  # the page's, even in a table row
            self._write("\n")
        self.charged += len(marker)
        depth = len(self.lists) + self.lists_past - 1
        # the first level has no indent: MAX_DEPTH levels, MAX_DEPTH - 1 indents
        self._put("  " * self._levels(depth, 2, MAX_DEPTH - 1) + marker if depth > 0 else marker)

    def _strong(self, tag: str, attrs: Any = None) -> None:
        self._write("**")

    def _em(self, tag: str, attrs: Any = None) -> None:
        self._write("*")

    def _code(self, tag: str, attrs: Any = None) -> None:
        if not self.pre:
            self._write("`")

    def _pre(self, tag: str, attrs: Any) -> None:
        self._block()
        self._write("```\n")
        self.pre += 1

    def _quote(self, tag: str, attrs: Any) -> None:
        self.quote += 1
        self._block()

    def _link(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        href = dict(attrs).get("href")
        if len(self.links) >= MAX_DEPTH:
            self.links_past += 1
            self.deep = True
            return
        self.links.append(href)
        if href:
            # its "](href)" is written when it closes; charged now, from this tag's share
            self.charged += 3 + len(href.encode("utf-8", "surrogatepass"))
            if self.cells is not None:
                self.charged += href.count("|")
            self._write("[")

    def _img(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        alt, src = a.get("alt") or "", a.get("src") or ""
        self._write(f"![{alt}]({src})" if src else alt)

    def _row(self, tag: str, attrs: Any) -> None:
        self.cells = 0
        self.row = _Out()
        self.cell = None
        self.header_row = False

    def _td(self, tag: str, attrs: Any) -> None:
        if self.cells is not None:
            self._cell()
            self.header_row = self.header_row or tag == "th"

    def _end_list(self, tag: str) -> None:
        if self.lists_past:
            self.lists_past -= 1
        elif self.lists:
            self.lists.pop()
        if not self.lists:
            self._block()

    def _end_pre(self, tag: str) -> None:
        self.pre = max(0, self.pre - 1)
        if not self.out.tail(1, 1) == "\n":
            self._write("\n")
        self._write("```")
        self._block()

    def _end_quote(self, tag: str) -> None:
        self.quote = max(0, self.quote - 1)
        self._block()

    def _end_link(self, tag: str) -> None:
        if self.links_past:
            self.links_past -= 1
            return
        href = self.links.pop() if self.links else None
        if href:
            self._put(f"]({href})")

    def _end_row(self, tag: str) -> None:
        if self.cells is None:
            return
        self._end_cell()
        cells, row = self.cells, self.row.text()
        self.cells, self.row = None, _Out()
        if not self.table_rows:
            self._block()
        self.charged += 5  # "| " and " |\n"; the cells' separators were charged with each cell
        self._put("| " + row + " |\n")
        if self.table_rows == 0:
            self.charged += 5
            self._put("| " + " | ".join(["---"] * min(cells, 1)) + " | ---" * (cells - 1) + " |\n")
        self.table_rows += 1

    def result(self) -> str:
        """The Markdown: each line's trailing whitespace dropped unless it ends in two spaces (a
        line break), blank lines run together, the whole stripped. Done a window of lines at a
        time: a regular expression's substitution keeps an object per match until it ends."""
        pieces: list[str] = []
        newlines = 0  # the line breaks that end what `pieces` hold (a run may span windows)
        for chunk in _windows(self.out.pieces()):
            chunk = _BLANK_LINES.sub("\n\n", _TRAILING.sub("", chunk))
            lead = len(chunk) - len(chunk.lstrip("\n"))
            if newlines + lead > 2:
                chunk = chunk[newlines + lead - 2 :]  # newlines <= 2: never more than `lead`
            if not chunk:
                continue
            if chunk.strip("\n"):
                newlines = len(chunk) - len(chunk.rstrip("\n"))
            else:
                newlines += len(chunk)
            pieces.append(chunk)
        while pieces and not pieces[0].strip():
            pieces.pop(0)
        while pieces and not pieces[-1].strip():
            pieces.pop()
        if not pieces:
            return ""
        pieces[0] = pieces[0].lstrip()
        pieces[-1] = pieces[-1].rstrip() + "\n"
        return "".join(pieces)


def _windows(chunks: list[str], size: int = 1 << 16) -> Iterator[str]:
    """The text of `chunks` in windows of about `size` characters, each ending with a line break
    (or the text), freeing each chunk as it is read."""
    carry = ""
    chunks.reverse()
    while chunks:
        text = carry + chunks.pop()
        start = 0
        while len(text) - start > size:
            cut = text.find("\n", start + size)
            if cut < 0:
                break
            yield text[start : cut + 1]
            start = cut + 1
        cut = text.rfind("\n", start)
        carry = text[cut + 1 :] if cut >= start else text[start:]
        if cut >= start:
            yield text[start : cut + 1]
    if carry:
        yield carry


_STARTS: dict[str, Callable[[_Markdown, str, Any], None]] = {
    **{tag: _Markdown._heading for tag in _HEADINGS},
    **{tag: _Markdown._a_block for tag in _BLOCKS},
    "br": _Markdown._br,
    "hr": _Markdown._hr,
    "ul": _Markdown._list,
    "ol": _Markdown._list,
    "li": _Markdown._item,
    "strong": _Markdown._strong,
    "b": _Markdown._strong,
    "em": _Markdown._em,
    "i": _Markdown._em,
    "code": _Markdown._code,
    "pre": _Markdown._pre,
    "blockquote": _Markdown._quote,
    "a": _Markdown._link,
    "img": _Markdown._img,
    "tr": _Markdown._row,
    "td": _Markdown._td,
    "th": _Markdown._td,
}
_ENDS: dict[str, Callable[[_Markdown, str], None]] = {
    # "table" is a block: its end is a block's end (its rows are not counted anew: a next table's
    # first row gets no separator, as before)
    **{tag: _Markdown._a_block for tag in (*_HEADINGS, *_BLOCKS)},
    "ul": _Markdown._end_list,
    "ol": _Markdown._end_list,
    "strong": _Markdown._strong,
    "b": _Markdown._strong,
    "em": _Markdown._em,
    "i": _Markdown._em,
    "code": _Markdown._code,
    "pre": _Markdown._end_pre,
    "blockquote": _Markdown._end_quote,
    "a": _Markdown._end_link,
    "tr": _Markdown._end_row,
}


_QUOTES = ["> " * depth for depth in range(MAX_DEPTH + 1)]
# a line's trailing run of whitespace (a run matched from its start only, so that a long run that
# does not end its line costs one try, not one per character) unless it ends in two spaces
_TRAILING = re.compile(r"(?<![^\S\n])[^\S\n]++(?<!  )$", re.MULTILINE)
_BLANK_LINES = re.compile(r"\n{3,}")


# --- HTML tokens -----------------------------------------------------------------------------------
# The converter read Python's html.parser.HTMLParser (3.11) events; it spends ~10 µs a tag, so a
# file of many tiny elements converted at a few hundred KB/s. This gives the same events by the same
# rules (its regular expressions, below), with one search per plain tag, and does not depend on the
# Python version's parser; what raised before (`<![x` in HTMLParser, text in a row before a cell) converts.

_PLAIN_TAG = re.compile(r"<(?:(/?)([a-zA-Z][^\t\n\r\f />\x00]*)>)?")
_TAGFIND = re.compile(r"([a-zA-Z][^\t\n\r\f />\x00]*)(?:\s|/(?!>))*")
_ATTRFIND = re.compile(
    r"((?<=['\"\s/])[^\s/>][^\s/=>]*)(\s*=+\s*('[^']*'|\"[^\"]*\"|(?!['\"])[^>\s]*))?(?:\s|/(?!>))*"
)
_START_TAG_END = re.compile(
    r"""
  <[a-zA-Z][^\t\n\r\f />\x00]*       # tag name
  (?:[\s/]*                          # optional whitespace before attribute name
    (?:(?<=['"\s/])[^\s/>][^\s/=>]*  # attribute name
      (?:\s*=+\s*                    # value indicator
        (?:'[^']*'                   # LITA-enclosed value
          |"[^"]*"                   # LIT-enclosed value
          |(?!['"])[^>\s]*           # bare value
         )
        \s*                          # possibly followed by a space
       )?(?:\s|/(?!>))*
     )*
   )?
  \s*                                # trailing whitespace
""",
    re.VERBOSE,
)
_END_TAG = re.compile(r"</\s*([a-zA-Z][-.a-zA-Z0-9:_]*)\s*>")
_COMMENT_END = re.compile(r"--\s*>")
_DECL_NAME = re.compile(r"[a-zA-Z][-_.a-zA-Z0-9]*\s*")
_SECTION_END = re.compile(r"]\s*]\s*>")
_MS_SECTION_END = re.compile(r"]\s*>")
_RAW_TEXT = ("script", "style")  # their content is text up to their end tag
_RAW_TEXT_END = {tag: re.compile(rf"</\s*{tag}\s*>", re.IGNORECASE) for tag in _RAW_TEXT}
_LETTERS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ")


def _html(text: str) -> tuple[str, list[str]]:
    md = _Markdown()
    _tokenize(text, md)
    return md.result(), md.notes


def _tokenize(text: str, md: _Markdown) -> None:
    """Feed `md` the events HTMLParser(convert_charrefs=True).feed(text); .close() would."""
    n, i = len(text), 0
    search, start, end, data = _PLAIN_TAG.search, md.start, md.end, md.data
    markup = _Markup(text, md)
    raw_text: str | None = None  # inside script or style: the element whose end tag ends the text
    while i < n:
        if raw_text is not None:
            m = _RAW_TEXT_END[raw_text].search(text, i)
            if m is None:  # never closed: the rest is its text (which is dropped)
                md.pos = n
                data(text[i:])
                return
            if m.start() > i:
                md.pos = m.start()
                data(text[i : m.start()])
            md.pos = i = m.end()
            end(raw_text)
            raw_text = None
            continue
        m = search(text, i)
        j = n if m is None else m.start()
        if j > i:
            md.pos = j
            chunk = text[i:j]
            data(unescape(chunk) if "&" in chunk else chunk)
        if m is None:
            return
        slash, name = m.groups()
        if name is not None:  # <name> or </name>
            md.pos = i = m.end()
            tag = name.lower()
            if slash:
                end(tag)
            else:
                start(tag, ())
                if tag in _RAW_TEXT:
                    raw_text = tag
            continue
        i, raw_text = markup.at(j)


class _Markup:
    """The markup at a "<" that is not a plain tag, read by HTMLParser's rules, in time linear in the
    document: HTMLParser searched to the end for what closes a construct each time one opened, so
    that thousands of `<!--x>` or of unclosed `<a ` took time in the square of their number. Here a
    search that found nothing is not repeated from further on, and a start tag that begins inside
    one found unclosed is not scanned again (HTMLParser scanned each; all of them end unclosed, text
    up to the next ">" or "<", unless a quote left open realigns one: a malformed corner)."""

    __slots__ = ("text", "md", "last_gt", "unmatched", "scanned")

    def __init__(self, text: str, md: _Markdown):
        self.text, self.md = text, md
        self.last_gt = text.rfind(">")  # no ">" past it
        self.unmatched: dict[re.Pattern, int] = {}  # a pattern's search found nothing from here on
        self.scanned = -1  # the end of the last start tag found unclosed

    def find_gt(self, start: int) -> int:
        return self.text.find(">", start) if start <= self.last_gt else -1

    def search(self, pattern: re.Pattern, start: int) -> re.Match | None:
        if start >= self.unmatched.get(pattern, len(self.text) + 1):
            return None
        found = pattern.search(self.text, start)
        if found is None:
            self.unmatched[pattern] = start
        return found

    def at(self, i: int) -> tuple[int, str | None]:
        """Where the markup at `text[i] == "<"` ends, and the element whose text it opened (script,
        style) or None."""
        text, md = self.text, self.md
        n = len(text)
        raw_text = None
        nxt = text[i + 1 : i + 2]
        if nxt in _LETTERS:
            k, raw_text = self.start_tag(i)
        elif nxt == "/":
            k = self.end_tag(i)
        elif text.startswith("<!--", i):
            m = self.search(_COMMENT_END, i + 4)
            k = m.end() if m else -1
        elif nxt == "?":
            k = self.find_gt(i + 2)
            k = k + 1 if k >= 0 else -1
        elif nxt == "!":
            k = self.declaration(i)
        elif i + 1 < n:
            md.pos = i + 1
            md.data("<")
            return i + 1, None
        else:
            k = -1
        if k < 0:  # not closed before the end: text, up to its first ">" (or the next "<")
            k = self.find_gt(i + 1)
            if k < 0:
                k = text.find("<", i + 1)
                if k < 0:
                    k = i + 1
            else:
                k += 1
            md.pos = k
            md.data(unescape(text[i:k]))
        return k, raw_text

    def start_tag(self, i: int) -> tuple[int, str | None]:
        """HTMLParser.check_for_whole_start_tag and parse_starttag: (-1, None) when not closed."""
        text, md = self.text, self.md
        if i < self.scanned:
            return -1, None
        j = _START_TAG_END.match(text, i).end()  # type: ignore[union-attr]
        nxt = text[j : j + 1]
        if nxt == ">":
            endpos = j + 1
        elif nxt == "/" and text.startswith("/>", j):
            endpos = j + 2
        elif nxt == "" or nxt in _LETTERS or nxt in "=/":
            self.scanned = j
            return -1, None
        else:
            endpos = j if j > i else i + 1
        md.pos = endpos
        m = _TAGFIND.match(text, i + 1)
        k = m.end()  # type: ignore[union-attr]
        tag = m.group(1).lower()  # type: ignore[union-attr]
        attrs: list[tuple[str, str | None]] = []
        while k < endpos:
            m = _ATTRFIND.match(text, k)
            if not m:
                break
            name, rest, value = m.group(1, 2, 3)
            if not rest:
                value = None
            elif value[:1] == "'" == value[-1:] or value[:1] == '"' == value[-1:]:
                value = value[1:-1]
            if value:
                value = unescape(value)
            attrs.append((name.lower(), value))
            k = m.end()
        closing = text[k:endpos].strip()
        if closing not in (">", "/>"):
            md.data(text[i:endpos])
            return endpos, None
        md.start(tag, attrs)
        if closing.endswith("/>"):
            md.end(tag)
            return endpos, None
        return endpos, tag if tag in _RAW_TEXT else None

    def end_tag(self, i: int) -> int:
        """HTMLParser.parse_endtag (outside script and style): -1 when not closed."""
        text, md = self.text, self.md
        gt = self.find_gt(i + 1)
        if gt < 0:
            return -1
        m = _END_TAG.match(text, i)
        if m:
            md.pos = gt + 1
            md.end(m.group(1).lower())
            return gt + 1
        name = _TAGFIND.match(text, i + 2)
        if not name:
            if text.startswith("</>", i):
                return i + 3
            pos = self.find_gt(i + 2)  # a comment
            return pos + 1 if pos >= 0 else -1
        gt = text.find(">", name.end())
        md.pos = gt + 1
        md.end(name.group(1).lower())
        return gt + 1

    def declaration(self, i: int) -> int:
        """Where `<!...` (a doctype, a marked section, a bogus comment) ends: -1 when not closed."""
        text = self.text
        if text.startswith("<![", i):
            m = _DECL_NAME.match(text, i + 3)
            if m is not None and m.end() == len(text):
                return -1
            name = m.group().strip().lower() if m else ""
            if name in {"temp", "cdata", "ignore", "include", "rcdata"}:
                found = self.search(_SECTION_END, i + 3)
                return found.end() if found else -1
            if name in {"if", "else", "endif"}:
                found = self.search(_MS_SECTION_END, i + 3)
                return found.end() if found else -1
            # any other name (or none): HTMLParser raises; a comment up to ">" here
        elif text[i : i + 9].lower() == "<!doctype":
            gt = self.find_gt(i + 9)
            return gt + 1 if gt >= 0 else -1
        gt = self.find_gt(i + 2)
        return gt + 1 if gt >= 0 else -1


# --- CSV -------------------------------------------------------------------------------------------


def _csv(text: str) -> tuple[str, list[str]]:
    """A table: the first row its header, each row padded to the widest (at most MAX_COLUMNS) while
    the output stays within its bound. Read twice (its width, then its rows), never held whole."""
    width = max(map(len, csv.reader(io.StringIO(text, newline=""))), default=0)
    if width == 0:
        return "", []
    columns = min(width, MAX_COLUMNS)
    notes = [_WIDE] if width > columns else []
    escape = "|" in text or '"' in text  # a cell holds a "|" or a line break only then
    out = _Out()
    # what the bound leaves: a row is at least its cells, its commas and its line break (the last
    # may have none: 8 bytes kept for it); the separator row and the header's padding come from SLACK
    spare = SLACK - 8
    separator = "| " + " | ".join(["---"] * columns) + " |"
    first = True
    for row in csv.reader(io.StringIO(text, newline="")):
        if not row:
            continue
        spare += GROWTH * (sum(map(len, row)) + len(row))
        if len(row) > columns:
            row = row[: columns - 1] + [", ".join(row[columns - 1 :])]
        if escape:
            row = [c.replace("|", "\\|").replace("\n", " ") for c in row]
        line = "| " + " | ".join(row)
        spare -= _utf8_len(line) + 3
        padding = columns - len(row)
        if padding and (first or spare >= 3 * padding):
            # a header must be as wide as the separator below it; other rows are padded if it fits
            line += " | " * padding
            spare -= 3 * padding
        elif padding and _UNPADDED not in notes:
            notes.append(_UNPADDED)
        out.add(line + " |\n")
        if first:
            out.add(separator + "\n")
            spare -= len(separator) + 1
            first = False
    return out.text(), notes
