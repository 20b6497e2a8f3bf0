"""engine.structured.json_close: cut a compact JSON object anywhere (any byte, mid-escape, mid-UTF-8
character, mid-number, mid-literal) and the closer's suffix makes it a JSON object again."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.structured.json_close import JsonCloser

SEPARATORS = (", ", ": ")  # what engine.structured.guide.JSON_OPTIONS has llguidance generate

scalars = st.one_of(
    st.text(max_size=12),  # escapes, control characters, astral and multi-byte characters
    st.integers(-(10**12), 10**12),
    st.floats(allow_nan=False, allow_infinity=False),
    st.booleans(),
    st.none(),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=20,
)
objects = st.dictionaries(st.text(max_size=8), values, max_size=5)


def closed(prefix: bytes) -> bytes:
    closer = JsonCloser()
    closer.feed(prefix)
    suffix = closer.suffix()
    assert suffix is not None, prefix
    return prefix + suffix


@settings(max_examples=150, deadline=None)
@given(objects, st.booleans())
def test_every_prefix_of_an_object_closes_into_an_object(obj, ascii_only):
    text = json.dumps(obj, separators=SEPARATORS, ensure_ascii=ascii_only).encode()
    for cut in range(len(text) + 1):
        whole = closed(text[:cut])
        assert isinstance(json.loads(whole.decode("utf-8")), dict), (text[:cut], whole)
    assert closed(text) == text  # a closed object needs nothing more


@pytest.mark.parametrize(
    ("prefix", "suffix"),
    [
        (b"", b"{}"),
        (b'{"k', b'": 0}'),
        (b'{"k"', b": 0}"),
        (b'{"k":', b" 0}"),
        (b'{"a": [1, ', b"0]}"),
        (b'{"a": 1, ', b'"": 0}'),
        (b'{"a": 1,', b' "": 0}'),
        (b'{"a": -', b"0}"),
        (b'{"a": 1e+', b"0}"),
        (b'{"a": tr', b"ue}"),
        (b'{"a": "x\\', b'n"}'),
        (b'{"a": "\\u12', b'00"}'),
        (b'{"a": "\xe2', b'\x80\x80"}'),  # U+2000
        (b'{"a": "\xe0', b'\xa0\x80"}'),  # E0 needs A0 or more: U+0800
        (b'{"a": [{"b": [', b"]}]}"),
    ],
)
def test_the_suffix_is_the_shortest_valid_close(prefix, suffix):
    closer = JsonCloser()
    closer.feed(prefix)
    assert closer.suffix() == suffix
    json.loads((prefix + suffix).decode())


@pytest.mark.parametrize("text", [b"[1]", b'{"a" : 1}', b'{"a": 1}}', b"{'a': 1}", b'{"a": 1} '])
def test_text_that_is_not_compact_json_leaves_it_lost(text):
    closer = JsonCloser()
    closer.feed(text)
    assert closer.lost and closer.suffix() is None  # it then forces nothing: the grammar decides


@settings(max_examples=100, deadline=None)
@given(values)
def test_any_value_mode_closes_every_prefix_of_any_value(value):
    # a GLM-4.5 tool argument written as JSON: any value, not only an object
    text = json.dumps(value, separators=SEPARATORS).encode()
    for cut in range(len(text) + 1):
        closer = JsonCloser(any_value=True)
        closer.feed(text[:cut])
        suffix = closer.suffix()
        assert suffix is not None, text[:cut]
        json.loads((text[:cut] + suffix).decode("utf-8"))
    closer = JsonCloser(any_value=True)
    closer.feed(text)
    assert closer.done and closer.suffix() == b""


def test_a_top_level_number_is_whole_once_it_has_a_digit():
    closer = JsonCloser(any_value=True)
    closer.feed(b"-")
    assert not closer.done and closer.suffix() == b"0"
    closer.feed(b"12")
    assert closer.done and closer.suffix() == b""
