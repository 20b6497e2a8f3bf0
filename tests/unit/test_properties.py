"""Property tests (hypothesis): the config parsers, the SSE encoder, and the msgspec wire frames
between the runtime and a remote PoP round-trip what they are given, and refuse anything else
with their own clear error (ConfigError, msgspec's DecodeError), never another exception."""

import json
import tomllib

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from edge_sim import remote
from edge_sim.request import GenerateRequest
from engine.outputs import SeqEvent
from engine.sampling import SamplingParams
from runtime.ai.shapes import sse
from runtime.control.config import parse_config
from runtime.control.config_schema import ConfigError
from runtime.control.jsonc import parse_jsonc

QUICK = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False), st.text()
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)
objects = st.dictionaries(st.text(), json_values, max_size=5)


@QUICK
@given(data=objects, indent=st.sampled_from([None, 2]), comment=st.text().map(lambda s: s.replace("\n", " ")))
def test_jsonc_round_trips_with_comments_and_trailing_commas(data, indent, comment):
    text = json.dumps(data, indent=indent)
    commented = f"// {comment}\n/* {comment.replace('*/', '')} */{text}"
    if text.endswith("}") and data:
        commented = commented[:-1].rstrip() + ",}"  # a trailing comma, as wrangler allows
    assert parse_jsonc(commented) == data


jsonc_texts = st.one_of(
    st.tuples(st.just("any"), st.text(max_size=200)),
    st.tuples(st.just("json"), json_values.map(json.dumps)),  # an object, or another value
    st.tuples(st.just("cut"), objects.map(lambda data: json.dumps(data)[:-1])),  # its closing } lost
)


@QUICK
@given(kind_text=jsonc_texts)
def test_jsonc_reads_any_json_object_and_refuses_the_rest_with_a_config_error_only(kind_text):
    kind, text = kind_text
    if kind == "cut":  # an object left open is never JSONC
        with pytest.raises(ConfigError, match=r"^wrangler\.jsonc: invalid JSON at line \d+, column \d+: "):
            parse_jsonc(text)
        return
    try:
        expected = json.loads(text)
    except ValueError:
        expected = None  # not JSON: JSONC may still read it (a comment, a trailing comma, a BOM)
    else:
        if isinstance(expected, dict):  # JSONC is a superset of JSON: the same object back
            assert parse_jsonc(text) == expected
        else:
            with pytest.raises(
                ConfigError, match=r"^wrangler\.jsonc: expected a JSON object at the top level"
            ):
                parse_jsonc(text)
        return
    assert kind == "any"
    try:
        assert isinstance(parse_jsonc(text), dict)
    except ConfigError as exc:
        assert str(exc).startswith("wrangler.jsonc: ")


@pytest.mark.parametrize("syntax", ["json", "toml"])
def test_config_nested_past_the_stack_is_a_config_error(syntax):
    text = (
        '{"name": ' + "[" * 100_000 + "]" * 100_000 + "}" if syntax == "json" else "name = " + "[" * 100_000
    )
    with pytest.raises(ConfigError):
        parse_config(text, syntax=syntax)


names = st.text(alphabet="abcdefghijklmnopqrstuvwxyz0123456789-", min_size=1, max_size=20)
toml_texts = st.one_of(
    st.tuples(st.just(None), st.text(max_size=200)),
    st.builds(  # a whole config (its name given back), then perhaps any text after it
        lambda name, date, tail: (
            name if not tail else None,
            f'name = "{name}"\nmain = "worker.py"\ncompatibility_date = "{date}"\n{tail}',
        ),
        names,
        st.dates().map(lambda d: d.isoformat()),
        st.one_of(st.just(""), st.text(max_size=50)),
    ),
)


@QUICK
@given(name_text=toml_texts)
def test_the_toml_config_parser_reads_a_config_and_refuses_any_other_text_with_a_config_error_only(
    name_text,
):
    name, text = name_text
    try:
        tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        with pytest.raises(ConfigError, match=r"^wrangler-like\.toml: invalid TOML: "):
            parse_config(text)
        return
    if name is not None:  # a whole config and nothing after it
        config = parse_config(text)
        assert (config.name, config.main) == (name, "worker.py")
        return
    try:
        config = parse_config(text)
    except ConfigError as exc:
        assert str(exc).startswith("wrangler-like.toml: ")
    else:
        assert isinstance(config.name, str) and config.name


def sse_payloads(stream: bytes) -> list:
    """A reference decoder (the WHATWG rules for data-only events): events split on a blank
    line, each `data:` line's value after one optional space, joined by newlines."""
    out = []
    for block in stream.decode().split("\n\n"):
        if not block:
            continue
        lines = [line[5:].removeprefix(" ") for line in block.split("\n") if line.startswith("data:")]
        assert len(lines) == len(block.split("\n")), f"a line that is not data: {block!r}"
        payload = "\n".join(lines)
        out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


@QUICK
@given(events=st.lists(objects, max_size=5))
def test_sse_events_decode_to_what_was_encoded(events):  # a str is sent as it is: only "[DONE]"
    stream = b"".join(sse(e) for e in events) + sse("[DONE]")
    assert sse_payloads(stream) == [*events, "[DONE]"]


requests = st.builds(
    GenerateRequest,
    model=st.text(max_size=30),
    prompt=st.one_of(st.none(), st.text(max_size=50)),
    messages=st.one_of(st.none(), st.lists(st.fixed_dictionaries({"role": st.text(), "content": st.text()}))),
    params=st.builds(
        SamplingParams,
        max_tokens=st.integers(0, 4096),
        temperature=st.floats(0, 5),
        seed=st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1)),
        stop=st.lists(st.text(max_size=5), max_size=3),
    ),
    tenant=st.text(max_size=20),
    session=st.one_of(st.none(), st.text(max_size=20)),
)
events = st.builds(
    SeqEvent,
    request_id=st.text(max_size=20),
    token_id=st.one_of(st.none(), st.integers(0, 2**31)),
    text=st.text(max_size=20),
    finish_reason=st.sampled_from([None, "stop", "length", "abort", "error"]),
)
frames = st.one_of(
    st.builds(remote.Frame, kind=st.just("event"), event=events),
    st.builds(
        remote.Frame, kind=st.just("error"), error_kind=st.text(max_size=20), message=st.text(max_size=50)
    ),
    st.builds(remote.Frame, kind=st.just("down")),
)


@QUICK
@given(req=requests, frame=frames)
def test_wire_structs_round_trip(req, frame):
    assert remote._decode_request(remote._encode(req)) == req
    framed = remote._frame(frame)
    (length,) = remote._HEADER.unpack_from(framed)
    assert length == len(framed) - remote._HEADER.size
    assert remote._decode_frame(framed[remote._HEADER.size :]) == frame


@QUICK
@given(data=st.binary(max_size=300), frame=frames, req=requests, cut=st.integers(0, 300))
def test_malformed_frames_are_refused_with_a_decode_error(data, frame, req, cut):
    # a frame or a request cut short, or of another shape, is refused (msgpack has no valid prefix)
    for encoded in (remote._encode(frame), remote._encode(req)):
        for decode in (remote._decode_frame, remote._decode_request):
            with pytest.raises(msgspec.DecodeError):
                decode(encoded[: min(cut, len(encoded) - 1)])
    with pytest.raises(msgspec.ValidationError, match="Invalid enum value 'nope'"):
        remote._decode_frame(remote._encode({"kind": "nope"}))
    with pytest.raises(msgspec.ValidationError, match="missing required field `model`"):
        remote._decode_request(remote._encode({"kind": "nope"}))
    # any bytes: a frame or a request of the declared types, or a DecodeError (ValidationError is one)
    for decode, kind in ((remote._decode_frame, remote.Frame), (remote._decode_request, GenerateRequest)):
        try:
            decoded = decode(data)
        except msgspec.DecodeError as exc:
            assert str(exc)
        else:
            assert isinstance(decoded, kind)
            if kind is remote.Frame:
                assert decoded.kind in ("event", "error", "down")
