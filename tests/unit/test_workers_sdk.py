import asyncio
import json

import pytest

from workers import AIError, Headers, Request, Response


def test_headers_are_case_insensitive_and_keep_repeats():
    h = Headers({"Content-Type": "text/plain"})
    h.append("Set-Cookie", "a=1")
    h.append("set-cookie", "b=2")
    assert h["content-type"] == "text/plain" and "CONTENT-TYPE" in h
    assert h.get("Set-Cookie") == "a=1, b=2"
    h.set("content-type", "application/json")
    assert h.get("Content-Type") == "application/json"
    assert h.get("missing") is None
    with pytest.raises(KeyError):
        h["missing"]


def test_request_body_accessors():
    req = Request("http://x/a", "post", [("X-A", "1")], b'{"k": [1, 2]}', {"colo": "ICN"})
    assert req.method == "POST" and req.headers["x-a"] == "1" and req.cf["colo"] == "ICN"
    assert asyncio.run(req.json()) == {"k": [1, 2]}
    assert asyncio.run(req.text()) == '{"k": [1, 2]}'
    assert asyncio.run(req.bytes()) == b'{"k": [1, 2]}'
    with pytest.raises(ValueError):
        asyncio.run(Request("http://x/", body=b"not json").json())


def test_response_constructors():
    r = Response.json({"a": "é"}, status=201, headers={"X-B": "2"})
    assert r.status == 201 and r.headers["content-type"] == "application/json"
    assert json.loads(r.body) == {"a": "é"} and r.headers["x-b"] == "2"
    assert Response.from_json([1]).body == "[1]"
    assert Response("hi").headers["content-type"].startswith("text/plain")
    red = Response.redirect("https://example.com/", 301)
    assert red.status == 301 and red.headers["location"] == "https://example.com/"
    with pytest.raises(ValueError):
        Response.redirect("/x", 200)
    with pytest.raises(ValueError):
        Response("x", status=99)


def test_ai_error_message_starts_with_code():
    err = AIError(5007, "no such model 'x'")
    assert str(err).startswith("5007: ") and err.code == 5007
