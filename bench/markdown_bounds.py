"""env.AI.toMarkdown's converter (workers.markdown) on a hostile tenant's files: for each file, its
size, the Markdown's size and ratio (the bound: GROWTH x the file + SLACK), and the MB of file
converted a second; then the converter as it was before its bounds (commit 31d9def, read with git)
on the same files at 64 KiB, as the baseline (at the full size it runs out of memory).

    python bench/markdown_bounds.py [--size BYTES] [--only NAME ...] [--memory] [--no-baseline]

--size: each file's size (default MAX_BYTES, the largest toMarkdown converts); --memory: the peak
memory of each conversion too (tracemalloc: slower, so its MB/s are not the ones to quote).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
import tracemalloc
import types
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from workers import markdown  # noqa: E402

BEFORE = "31d9def"  # the converter before its bounds (issue 57, item 13)
BASELINE_BYTES = 64 * 1024


def files(size: int) -> dict[str, tuple[str, bytes]]:
    """Name -> (mime type, bytes) of about `size` bytes each."""

    def fill(unit: bytes, n: int = size) -> bytes:
        return unit * max(1, n // len(unit))

    half, deep = size // 2, markdown.MAX_DEPTH
    html, csv = "text/html", "text/csv"
    normal_page = (
        b"<h2>Notes</h2><p>Some <b>bold</b> and <a href='https://example.com/x'>a link</a> in a "
        b"paragraph of ordinary length, with a little more text to read.</p><ul><li>one</li><li>two "
        b"<ul><li>nested</li></ul></li></ul><blockquote><p>quoted words</p></blockquote>"
        b"<table><tr><th>k</th><th>v</th></tr><tr><td>a</td><td>1</td></tr></table>"
    )

    def after(head: bytes, unit: bytes, tail: bytes = b"") -> bytes:  # at most `size` in all
        return head + fill(unit, size - len(head) - len(tail)) + tail

    return {
        "normal page": (html, fill(normal_page)),
        "normal CSV": (csv, fill(b"alpha,beta,gamma,delta,1234,5678\n")),
        "nested block quotes": (html, fill(b"<blockquote>", half) + fill(b"<p>x</p>", half)),
        "nested lists": (html, fill(b"<ul><li>")),
        "nested lists, items at each": (html, fill(b"<ol><li>a<li>b")),
        "quotes and lists mixed": (
            html,
            fill(b"<blockquote><ul><li><ol><li>", half) + fill(b"<hr><p>", half),
        ),
        "rules in quotes 16 deep": (html, after(b"<blockquote>" * deep, b"<hr>")),
        "paragraphs in quotes 16 deep": (html, after(b"<blockquote>" * deep, b"<p>")),
        "items in lists 16 deep": (html, after(b"<ul>" * deep, b"<li>")),
        "tiny elements <b>": (html, fill(b"<b>")),
        "tiny elements <p>": (html, fill(b"<p>")),
        "tiny elements <i>x": (html, fill(b"<i>x")),
        "numbered items": (html, after(b"<ol>", b"<li>")),
        "table cells": (html, after(b"<table>", b"<tr><td>a<td>b</tr>")),
        "links": (html, fill(b"<a href=x>y</a>")),
        "bytes not UTF-8": (html, fill(b"\xff")),
        "unclosed comments": (html, fill(b"<!--x>")),
        "unclosed start tags": (html, fill(b"<a ")),
        "start tags in an unclosed one": (html, after(b"", b'<a x=">" ', b"c=")),
        "CSV: one wide row": (csv, after(b"", b"a\n", b"," * (size // 5) + b"\n")),
        "CSV: wide header, narrow rows": (csv, after(b"," * 1000 + b"\n", b"a\n")),
        "CSV: huge table of tiny rows": (csv, fill(b"x\n")),
        "CSV: bytes not UTF-8": (csv, fill(b"\xff\n")),
    }


def before() -> types.ModuleType | None:
    """The converter at BEFORE, or None without git or that commit."""
    try:
        source = subprocess.run(
            ["git", "show", f"{BEFORE}:workers/markdown.py"],
            cwd=REPO,
            capture_output=True,
            check=True,
            text=True,
        ).stdout
    except (OSError, subprocess.CalledProcessError):
        return None
    module = types.ModuleType("markdown_before")
    exec(compile(source, f"{BEFORE}:workers/markdown.py", "exec"), module.__dict__)  # noqa: S102
    return module


def measure(convert: Callable, mime: str, data: bytes, memory: bool) -> tuple[int, float, int | None, str]:
    """(Markdown bytes, seconds, peak bytes or None, note)."""
    if memory:
        tracemalloc.start()
    started = time.perf_counter()
    out = convert("file", mime, data)
    took = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1] if memory else None
    if memory:
        tracemalloc.stop()
    if out["format"] != "markdown":
        raise ValueError(out["error"])
    return len(out["data"].encode()), took, peak, out.get("note", "")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--size", type=int, default=markdown.MAX_BYTES)
    parser.add_argument("--only", nargs="*", default=None, help="files whose name contains one of these")
    parser.add_argument("--memory", action="store_true")
    parser.add_argument("--no-baseline", action="store_true")
    args = parser.parse_args()
    old = None if args.no_baseline else before()
    bound = f"{markdown.GROWTH}x + {markdown.SLACK} B"
    print(f"workers.markdown: each file {args.size / 2**20:.1f} MiB; the bound: Markdown <= {bound}")
    if old is None and not args.no_baseline:
        print(f"(no baseline: git or commit {BEFORE} not found)")
    head = f"{'file':31} {'in MB':>6} {'out MB':>7} {'out/in':>6} {'ok':>3} {'MB/s':>6}"
    head += f" {'peak MB':>8}" if args.memory else ""
    head += f" | {'before, 64 KiB: out/in':>22} {'MB/s':>6}" if old else ""
    print(head + "  note")
    worst = float("inf")
    small = files(BASELINE_BYTES)
    for name, (mime, data) in files(args.size).items():
        if args.only and not any(o.lower() in name.lower() for o in args.only):
            continue
        size, took, peak, note = measure(markdown.convert, mime, data, args.memory)
        ok = 0 <= size <= markdown.GROWTH * len(data) + markdown.SLACK
        rate = len(data) / took / 1e6
        if not name.startswith("normal"):
            worst = min(worst, rate)
        row = f"{name:31} {len(data) / 1e6:6.2f} {size / 1e6:7.2f} {size / len(data):6.2f}"
        row += f" {'yes' if ok else 'NO':>3} {rate:6.2f}" + (
            f" {peak / 1e6:8.1f}" if peak is not None else ""
        )
        if old:
            part = small[name][1]
            try:
                was, was_took, _, _ = measure(old.convert, mime, part, False)
                row += f" | {was / len(part):22.2f} {len(part) / was_took / 1e6:6.2f}"
            except Exception as exc:  # the old converter raised on some hostile markup
                row += f" | {type(exc).__name__:>22} {'':>6}"
        print(row + ("  " + note[:60] if note else ""), flush=True)
    if worst != float("inf"):
        print(f"slowest hostile file: {worst:.2f} MB/s")


if __name__ == "__main__":
    main()
