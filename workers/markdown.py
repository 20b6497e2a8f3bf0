"""`env.AI.toMarkdown(files)`: documents to Markdown, as Cloudflare's Markdown Conversion answers
(`[{name, mimeType, format: "markdown", tokens, data}]`, or `format: "error"` with `error` for a
file it cannot convert). HTML, plain text, Markdown and CSV are converted, with the standard
library only; PDF, images and office documents need converters this runtime does not ship, so
each such file answers an error that says what is supported.

It runs in the isolate: it needs no state of the runtime's, and its CPU time is the worker's, held
by the worker's own limits. MAX_BYTES bounds a file."""

from __future__ import annotations

import csv
import io
from html.parser import HTMLParser
from typing import Any

MAX_BYTES = 10 * 1024 * 1024
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
    """One file's result, in Cloudflare's shape."""
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
    if mime == "text/html":
        markdown = html_to_markdown(text)
    elif mime == "text/csv":
        markdown = csv_to_markdown(text)
    else:
        markdown = text.strip() + "\n" if text.strip() else ""
    return {**base, "format": "markdown", "tokens": -(-len(markdown) // CHARS_PER_TOKEN), "data": markdown}


def csv_to_markdown(text: str) -> str:
    rows = [r for r in csv.reader(io.StringIO(text)) if r]
    if not rows:
        return ""
    width = max(len(r) for r in rows)

    def line(cells: list[str]) -> str:
        cells = [c.replace("|", "\\|").replace("\n", " ") for c in cells] + [""] * (width - len(cells))
        return "| " + " | ".join(cells) + " |"

    return "\n".join([line(rows[0]), "| " + " | ".join(["---"] * width) + " |", *map(line, rows[1:])]) + "\n"


def html_to_markdown(text: str) -> str:
    parser = _Markdown()
    parser.feed(text)
    parser.close()
    return parser.result()


class _Markdown(HTMLParser):
    """Headings, paragraphs, line breaks, links, images' alt text, lists (nested), emphasis, inline
    code and preformatted blocks, block quotes, rules and table rows; scripts, styles and the
    head dropped; the rest's text kept."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self.dropping = 0  # inside script / style / head ...
        self.lists: list[list[int | None]] = []  # per open list: [its next number] (None: bullets)
        self.links: list[str | None] = []
        self.pre = 0
        self.quote = 0
        self.cells: list[str] | None = None
        self.header_row = False
        self.table_rows = 0

    # what to write --------------------------------------------------------------------------------

    def _write(self, text: str) -> None:
        if self.cells is not None:
            self.cells[-1] += text
            return
        self.out.append(text)

    def _block(self) -> None:
        """A block begins or ends: a blank line (once) before what follows."""
        if self.cells is not None:
            return
        joined = "".join(self.out[-3:])
        if self.out and not joined.endswith("\n\n"):
            self.out.append("\n" if joined.endswith("\n") else "\n\n")
        if self.quote:
            self.out.append("> " * self.quote)

    # the parser's events ---------------------------------------------------------------------------

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag in _DROPPED:
            self.dropping += 1
        if self.dropping:
            return
        if tag in _HEADINGS:
            self._block()
            self._write("#" * _HEADINGS[tag] + " ")
        elif tag in _BLOCKS:
            self._block()
        elif tag == "br":
            self._write("  \n")
        elif tag == "hr":
            self._block()
            self._write("---")
            self._block()
        elif tag in ("ul", "ol"):
            if self.lists:
                self._write("\n")
            else:
                self._block()
            self.lists.append([1] if tag == "ol" else [None])
        elif tag == "li":
            indent = "  " * max(0, len(self.lists) - 1)
            numbering = self.lists[-1] if self.lists else [None]
            if numbering[0] is None:
                marker = "- "
            else:
                marker = f"{numbering[0]}. "
                numbering[0] += 1
            if self.out and not "".join(self.out[-2:]).endswith("\n"):
                self._write("\n")
            self._write(indent + marker)
        elif tag in ("strong", "b"):
            self._write("**")
        elif tag in ("em", "i"):
            self._write("*")
        elif tag == "code" and not self.pre:
            self._write("`")
        elif tag == "pre":
            self._block()
            self._write("```\n")
            self.pre += 1
        elif tag == "blockquote":
            self.quote += 1
            self._block()
        elif tag == "a":
            href = a.get("href")
            self.links.append(href)
            if href:
                self._write("[")
        elif tag == "img":
            alt, src = a.get("alt") or "", a.get("src") or ""
            self._write(f"![{alt}]({src})" if src else alt)
        elif tag == "tr":
            self.cells = []
            self.header_row = False
        elif tag in ("td", "th") and self.cells is not None:
            self.cells.append("")
            self.header_row = self.header_row or tag == "th"

    def handle_endtag(self, tag: str) -> None:
        if tag in _DROPPED:
            self.dropping = max(0, self.dropping - 1)
            return
        if self.dropping:
            return
        if tag in _HEADINGS or tag in _BLOCKS:
            self._block()
        elif tag in ("ul", "ol"):
            if self.lists:
                self.lists.pop()
            if not self.lists:
                self._block()
        elif tag in ("strong", "b"):
            self._write("**")
        elif tag in ("em", "i"):
            self._write("*")
        elif tag == "code" and not self.pre:
            self._write("`")
        elif tag == "pre":
            self.pre = max(0, self.pre - 1)
            if not "".join(self.out[-1:]).endswith("\n"):
                self._write("\n")
            self._write("```")
            self._block()
        elif tag == "blockquote":
            self.quote = max(0, self.quote - 1)
            self._block()
        elif tag == "a":
            href = self.links.pop() if self.links else None
            if href:
                self._write(f"]({href})")
        elif tag == "tr" and self.cells is not None:
            cells = [" ".join(c.split()).replace("|", "\\|") for c in self.cells]
            self.cells = None
            if not self.table_rows:
                self._block()
            self._write("| " + " | ".join(cells) + " |\n")
            if self.table_rows == 0:
                self._write("| " + " | ".join(["---"] * len(cells)) + " |\n")
            self.table_rows += 1
        elif tag == "table":
            self.table_rows = 0
            self._block()

    def handle_data(self, data: str) -> None:
        if self.dropping:
            return
        if self.pre:
            self._write(data)
            return
        text = " ".join(data.split())
        if not text:
            if data and self.out and not self.out[-1].endswith((" ", "\n")):
                self._write(" ")
            return
        lead = " " if data[:1].isspace() and self.out and not self.out[-1].endswith((" ", "\n", "[")) else ""
        trail = " " if data[-1:].isspace() else ""
        self._write(lead + text + trail)

    def result(self) -> str:
        lines = [line.rstrip() if not line.endswith("  ") else line for line in "".join(self.out).split("\n")]
        text = "\n".join(lines)
        while "\n\n\n" in text:
            text = text.replace("\n\n\n", "\n\n")
        return text.strip() + "\n" if text.strip() else ""
