"""Input alone never gets a 500: JSON nested 100,000 deep, a lone surrogate, numbers past any
range, a location header that names nothing, a worker name that is not one. Each API answers 4xx
in its own shape, with a code and a message that says what to change."""

import textwrap

import pytest
from starlette.testclient import TestClient

from runtime.app import Runtime, create_app
from runtime.control.config import parse_config
from runtime.http.json_body import MAX_DEPTH, BadJSON, decode_json, depth_over
from tests.conftest import TINY_MODEL

ADMIN = {"authorization": "Bearer adm-token"}
DEEP = b"[" * 100_000 + b"]" * 100_000
DEEP_INSIDE = b'{"prompt": "x", "a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
LONE = b'{"prompt": "\\ud800", "max_tokens": 2}'


def test_decode_json_bounds_depth_and_names_a_lone_surrogate():
    for body in (DEEP, DEEP_INSIDE, b"[" * (MAX_DEPTH + 1) + b"]" * (MAX_DEPTH + 1)):
        with pytest.raises(BadJSON, match=f"more than {MAX_DEPTH} deep"):
            decode_json(body)
    assert decode_json(b"[" * MAX_DEPTH + b"]" * MAX_DEPTH) is not None
    with pytest.raises(BadJSON, match=r"\\ud800 at byte 12 is half of a UTF-16 surrogate pair"):
        decode_json(LONE)
    with pytest.raises(BadJSON, match=r"\\udc00 at byte 1 is half"):
        decode_json(b'"\\udc00"')
    assert decode_json(b'"\\ud83d\\ude00"') == "\U0001f600"  # a whole pair is fine
    assert decode_json(b'"\\\\ud800"') == "\\ud800"  # an escaped backslash, then text
    with pytest.raises(BadJSON, match="number out of range"):
        decode_json(b"[1e400]")
    assert not depth_over({"a": [1, {"b": []}]}, 4) and depth_over({"a": [1, {"b": []}]}, 3)


@pytest.fixture
def client(tmp_path, icn_edge):
    (tmp_path / "worker.py").write_text("from workers import WorkerEntrypoint\n")
    config = parse_config(
        textwrap.dedent("""
        name = "hostile"
        main = "worker.py"
        compatibility_date = "2026-11-01"
    """),
        base_dir=tmp_path,
    )
    rt = Runtime(config, icn_edge, admin_token="adm-token")
    client = TestClient(create_app(rt))  # no lifespan: the dev worker's isolate never starts
    r = client.post("/cdn-cgi/edge/accounts", json={"name": "acme"}, headers=ADMIN)
    assert r.status_code == 201, r.text
    client.headers["authorization"] = f"Bearer {r.json()['token']['token']}"
    yield client
    rt.state.close()
    rt.bindings.close()


A = "/client/v4/accounts/acme"


def cf_code(r, status):
    assert r.status_code == status, r.text
    body = r.json()
    assert body["success"] is False
    return body["errors"][0]["code"], body["errors"][0]["message"]


def openai_code(r, status):
    assert r.status_code == status, r.text
    return r.json()["error"]["code"], r.json()["error"]["message"]


@pytest.mark.parametrize("body", [DEEP, DEEP_INSIDE, LONE, b'{"prompt": "x", "max_tokens": 1e400}'])
def test_workers_ai_rest_refuses_bad_json_with_5004(client, body):
    code, message = cf_code(client.post(f"{A}/ai/run/{TINY_MODEL}", content=body), 400)
    assert code == 5004 and "send" in message


def test_workers_ai_rest_streaming_refuses_a_lone_surrogate_before_the_stream(client):
    body = b'{"prompt": "\\ud800", "stream": true}'
    code, message = cf_code(client.post(f"{A}/ai/run/{TINY_MODEL}", content=body), 400)
    assert code == 5004 and "surrogate" in message


def test_a_seed_past_64_bits_is_400_on_both_apis(client):
    big = 2**70
    code, message = cf_code(client.post(f"{A}/ai/run/{TINY_MODEL}", json={"prompt": "x", "seed": big}), 400)
    assert code == 5004 and message.startswith("seed: must be a 64-bit integer")
    chat = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "x"}], "seed": big}
    code, message = openai_code(client.post(f"{A}/ai/v1/chat/completions", json=chat), 400)
    assert code == 5004 and message.startswith("seed:")


@pytest.mark.parametrize("path", ["/ai/v1/chat/completions", "/ai/v1/completions"])
def test_openai_refuses_bad_json_with_400(client, path):
    lone = b'{"model": "m", "prompt": "\\udfff", "messages": [{"role": "user", "content": "\\ud800"}]}'
    for body, fragment in ((DEEP_INSIDE, "deep"), (lone, "surrogate")):
        r = client.post(A + path, content=body)
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert error["type"] == "invalid_request_error" and fragment in error["message"]


def test_a_location_that_names_nothing_is_1110_not_500(client):
    weird = {"x-edge-client-location": b"\xff"}
    code, message = cf_code(client.post(f"{A}/ai/run/{TINY_MODEL}", json={"prompt": "x"}, headers=weird), 400)
    assert code == 1110 and message.startswith("x-edge-client-location: unknown location")
    chat = {"model": TINY_MODEL, "messages": [{"role": "user", "content": "x"}]}
    code, _ = openai_code(client.post(f"{A}/ai/v1/chat/completions", json=chat, headers=weird), 400)
    assert code == 1110


@pytest.mark.parametrize(
    "method, path, body",
    [
        ("PUT", "/workers/scripts/w1", DEEP),
        ("PUT", "/workers/scripts/w1", b'{"main": "a.py", "files": {"a.py": "\\ud800"}}'),
        ("PUT", "/workers/scripts/w1/secrets", b'{"name": "A", "text": "\\ud800"}'),
        ("POST", "/workers/scripts/w1/deployments", DEEP_INSIDE),
        ("POST", "/workers/scripts/w1/rollback", b'{"version_id": "\\ud800"}'),
    ],
)
def test_the_control_plane_refuses_bad_json_with_10014(client, method, path, body):
    code, message = cf_code(client.request(method, A + path, content=body), 400)
    assert code == 10014 and message


def test_a_worker_name_that_is_not_one_is_refused_before_anything_is_written(client):
    upload = {"main": "a.py", "files": {"a.py": "x = 1"}}
    code, message = cf_code(client.put(f"{A}/workers/scripts/w%ED%A0%80", json=upload), 400)
    assert code == 10014 and message.startswith("worker name") and "active version is unchanged" in message


@pytest.mark.parametrize(
    "method, path",
    [("POST", "/cdn-cgi/edge/accounts"), ("PATCH", "/cdn-cgi/edge/accounts/acme")],
)
def test_account_endpoints_refuse_bad_json_with_1120(client, method, path):
    for body in (DEEP_INSIDE.replace(b"[" * 100_000, b"[" * 100).replace(b"]" * 100_000, b"]" * 100), LONE):
        r = client.request(method, path, content=body, headers=ADMIN)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == 1120
