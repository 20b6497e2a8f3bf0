"""env.AI.toMarkdown's converter (workers.markdown) against a hostile tenant's files: whatever the
file, the Markdown is at most GROWTH x its bytes + SLACK (deep block quotes and lists, rules in deep
quotes, a wide CSV row among many narrow ones, tiny elements by the million, bytes that are not
UTF-8), nesting past MAX_DEPTH or past the bound is flattened and the result says so in `note`;
markup HTMLParser raised on converts; documents within the bounds convert exactly as before. (The
throughput of the same files, and of the unclosed markup here that took HTMLParser time in the square
of its length: bench/markdown_bounds.py; tests assert sizes, never times.)"""

from __future__ import annotations

import random

import pytest

from workers.markdown import GROWTH, MAX_COLUMNS, MAX_DEPTH, SLACK, convert, csv_to_markdown, html_to_markdown

N = 2_000  # deep enough that the quadratic converter wrote hundreds of times its input


def fill(unit: bytes, size: int) -> bytes:
    return unit * (size // len(unit))


HOSTILE_HTML = {
    "nested block quotes": b"<blockquote>" * N + b"<p>x</p>" * N,
    "nested lists": b"<ul><li>" * N + b"x",
    "nested ordered lists, items at each": b"<ol><li>a<li>b" * N,
    "quotes and lists mixed": b"<blockquote><ul><li><ol><li>" * N + b"<hr><p>" * N,
    "rules in quotes as deep as rendered": b"<blockquote>" * MAX_DEPTH + b"<hr>" * 20 * N,
    "paragraphs in quotes as deep as rendered": b"<blockquote>" * MAX_DEPTH + b"<p>" * 20 * N,
    "items in lists as deep as rendered": b"<ul>" * MAX_DEPTH + b"<li>" * 20 * N,
    "headings in quotes": b"<blockquote>" * MAX_DEPTH + b"<h6>" * 20 * N,
    "cells in quotes": b"<blockquote>" * MAX_DEPTH + b"<tr><td>|</tr>" * 5 * N,
    "links by the thousand": b"<a href='|'>" * N + b"</a>" * N,
    "numbered items by the thousand": b"<ol>" + b"<li>" * 20 * N,
    "tiny elements": b"<b>" * 20 * N,
    "bytes that are not UTF-8": b"<p>" + b"\xff" * 20 * N,
    "a table row of empty cells": b"<table><tr>" + b"<td>" * 20 * N + b"</tr></table>",
    # markup HTMLParser searched to the end for, each time it opened (time in the square of its count)
    "unclosed comments": b"<!--x>" * 10 * N,
    "unclosed sections": b"<![CDATA[>" * 10 * N,
    "unclosed start tags": b"<a " * 10 * N,
    "start tags in an unclosed one": b'<a x=">" ' * 10 * N + b"c=",
}
HOSTILE_CSV = {
    "one wide row among many narrow ones": b"a\n" * N + b"," * N + b"\n",
    "a wide header over many narrow rows": b"," * N + b"\n" + b"a\n" * N,
    "rows of one byte that is not UTF-8": b"\xff\n" * 20 * N,
    "rows of pipes": b"|,|,|\n" * 5 * N,
}


def bounded(data: bytes, mime: str) -> dict:
    out = convert("file", mime, data)
    assert out["format"] == "markdown", out
    assert len(out["data"].encode()) <= GROWTH * len(data) + SLACK, (len(out["data"]), len(data))
    return out


@pytest.mark.parametrize("name", list(HOSTILE_HTML))
def test_hostile_html_stays_within_the_bound(name):
    bounded(HOSTILE_HTML[name], "text/html")


@pytest.mark.parametrize("name", list(HOSTILE_CSV))
def test_hostile_csv_stays_within_the_bound(name):
    bounded(HOSTILE_CSV[name], "text/csv")


def test_nesting_past_the_depth_is_flattened_and_the_result_says_so():
    deep = bounded(b"<blockquote>" * (MAX_DEPTH + 4) + b"<p>deep words</p>" * 3, "text/html")
    assert "> " * MAX_DEPTH + "deep words" in deep["data"] and "> " * (MAX_DEPTH + 1) not in deep["data"]
    assert f"deeper than {MAX_DEPTH} levels" in deep["note"]
    items = bounded(b"<ul><li>x" * (MAX_DEPTH + 4), "text/html")
    assert "  " * (MAX_DEPTH - 1) + "- x" in items["data"] and "  " * MAX_DEPTH + "-" not in items["data"]
    assert "flattened" in items["note"]
    rules = bounded(b"<blockquote>" * MAX_DEPTH + b"<hr>" * 2000, "text/html")
    assert f"over {GROWTH}x" in rules["note"]  # within the depth, flattened to keep to the bound
    normal = convert(
        "a.html", "text/html", b"<blockquote><blockquote><p>two deep</p></blockquote></blockquote>"
    )
    assert "note" not in normal and "> > two deep" in normal["data"]


def test_a_wide_csv_is_folded_into_its_last_column_and_says_so():
    row = ",".join(str(i) for i in range(MAX_COLUMNS + 10))
    out = bounded(f"{row}\n{row}\n".encode(), "text/csv")
    header = out["data"].splitlines()[0]
    assert header.count(" | ") == MAX_COLUMNS - 1
    assert header.endswith(" | " + ", ".join(str(i) for i in range(MAX_COLUMNS - 1, MAX_COLUMNS + 10)) + " |")
    assert f"wider than {MAX_COLUMNS} columns" in out["note"]
    ragged = bounded(b"a,b,c\n" + b"x\n" * 2000, "text/csv")  # the padding would be 6 bytes a row
    assert "not padded" in ragged["note"] and "| x |\n" in ragged["data"]


def test_random_mixtures_of_hostile_markup_stay_within_the_bound():
    pieces = (
        b"<blockquote> </blockquote> <ul> <ol> </ol> <li> <hr> <p> <tr> <td> </tr> <table> </table> "
        b"<a href=|> </a> <pre> </pre> <h1> <br> <img src=x alt=|> | \xff x <b> <code>"
    ).split(b" ") + [b" ", b"\n"]
    for seed in range(40):
        r = random.Random(seed)
        weights = [r.random() ** 3 for _ in pieces]
        bounded(b"".join(r.choices(pieces, weights, k=4000)), "text/html")


def test_markup_htmlparser_raised_on_converts():
    assert html_to_markdown("<table><tr>cell text before any cell</tr></table>") == (
        "| cell text before any cell |\n| --- |\n"
    )
    assert html_to_markdown("<![unknown[ x ]]> after") == "after\n"
    out = convert("big.csv", "text/csv", b'"' + b"x" * 200_000 + b'"\n')  # past csv's field limit
    assert out["format"] == "error" and "not CSV that can be read" in out["error"]


def test_documents_within_the_bounds_convert_as_before():
    # outputs of the converter before its bounds (commit 31d9def)
    page = (
        "<blockquote><p>a</p><blockquote><p>b</p><ul><li>one<ul><li>two<ol><li>three</li><li>four</li>"
        "</ol></li></ul></li></ul></blockquote></blockquote><hr><table><tr><th>k</th><th>v|w</th></tr>"
        "<tr><td>1</td><td><b>2</b></td></tr></table>"
        "<p><a href='/x'>link</a> and <img src='i.png' alt='i'></p>"
    )
    assert html_to_markdown(page) == (
        ">\n\n> a\n\n>\n\n> >\n\n> > b\n\n> >\n\n> >\n- one\n  - two\n    1. three\n    2. four\n\n> >\n\n"
        ">\n\n---\n\n| k | v\\|w |\n| --- | --- |\n| 1 | **2** |\n\n[link](/x) and ![i](i.png)\n"
    )
    assert (
        csv_to_markdown("a,b,c\n1,2\n3\n")
        == "| a | b | c |\n| --- | --- | --- |\n| 1 | 2 |  |\n| 3 |  |  |\n"
    )
