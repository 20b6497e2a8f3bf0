"""Fuzzing a real `edge dev` from its own OpenAPI document (schemathesis): every operation of the
Workers AI, OpenAI-compatible and control-plane APIs gets a bounded number of generated requests,
valid and invalid, and no answer may be a 5xx or break the document's response schemas. The worker
front door, which has no schema of its own, gets arbitrary bodies and headers (hypothesis).

The operations left out change the serving itself (a PoP down, a model reloaded) or never end
(the tail stream); tests/faults covers those."""

from __future__ import annotations

import textwrap

import httpx
import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from runtime.bench.devserver import write_project
from runtime.routes.openapi import PATH
from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

MODEL = "@edge/moonshotai/kimi-k2-mini"
EXAMPLES = 6  # per operation and mode: ~25 operations x 2 modes keep the run near a minute
LEFT_OUT = ("/pops/{code}/{action}", "/models/reload", "/tail")
WORKER = """
from workers import AIError, Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        try:
            body = await request.json()
        except ValueError:
            return Response.json({"error": "send a JSON body"}, status=400)
        if not isinstance(body, dict) or not isinstance(body.get("prompt"), str):
            return Response.json({"error": "send a prompt"}, status=400)
        try:
            out = await self.env.AI.run("@MODEL@", {"prompt": body["prompt"], "max_tokens": body.get("n", 2)})
        except AIError as exc:
            return Response.json({"error": str(exc)}, status=400)
        return Response.json(out)

    async def scheduled(self, controller, env, ctx):
        pass
"""
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    database=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("fuzz")
    write_project(d, "fuzz", worker=textwrap.dedent(WORKER).replace("@MODEL@", MODEL))
    with DevServer(d / "wrangler-like.toml", cwd=d) as srv:
        srv.token = (d / ".edge" / "api-token").read_text().strip()
        srv.admin = (d / ".edge" / "admin-token").read_text().strip()
        yield srv


class Tally:
    def __init__(self):
        self.inputs, self.server_errors = 0, []

    def note(self, case, response) -> None:
        self.inputs += 1
        if response.status_code >= 500:
            self.server_errors.append(f"{case.method} {case.formatted_path} -> {response.status_code}")


def fuzz_operation(server, operation, mode, tally: Tally) -> None:
    """EXAMPLES generated requests to one operation; raises on the first that fails a check."""
    token = server.admin if operation.path.startswith("/cdn-cgi/") else server.token
    auth = {"authorization": f"Bearer {token}"}
    own_account = "{account}" in operation.path and mode is schemathesis.GenerationMode.POSITIVE

    @FUZZ
    @given(case=operation.as_strategy(generation_mode=mode))
    def fuzz(case):
        if own_account:  # the token's own account: past the auth check, into the handler
            case.path_parameters["account"] = "local"
        response = case.call(base_url=server.url, headers=auth, timeout=60)
        tally.note(case, response)
        case.validate_response(response, checks=[not_a_server_error, response_schema_conformance])

    fuzz()


def test_no_api_operation_answers_5xx_or_off_its_schema(server):
    schema = schemathesis.openapi.from_url(server.url + PATH)
    tally, failures = Tally(), []
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path.endswith(LEFT_OUT):
            continue
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            try:
                fuzz_operation(server, operation, mode, tally)
            except Unsatisfiable:  # nothing to make invalid: no parameter, no body
                assert mode is schemathesis.GenerationMode.NEGATIVE, operation.path
            except Exception as exc:  # every operation is tried before the test fails
                failures.append(f"{operation.method.upper()} {operation.path} ({mode.value}): {exc}"[:600])
    print(f"\nfuzz: {tally.inputs} inputs over the APIs, {len(tally.server_errors)} answered 5xx")
    assert tally.inputs > 100
    assert tally.server_errors == [] and failures == [], "\n".join(tally.server_errors + failures)


# any bytes an HTTP client will send in a header value: h11 refuses controls and edge whitespace
HEADER_TEXT = st.binary(max_size=40).map(lambda b: bytes(c for c in b if c >= 0x20 and c != 0x7F).strip())


def test_the_worker_front_door_answers_any_body_and_header_without_a_5xx(server):
    """The worker's own code decides, but the runtime's part (location, body, env.AI.run's inputs)
    must never turn input into a 500: deep JSON, lone surrogates, huge ints, odd header bytes."""
    tricky = st.sampled_from(
        [
            b"[" * 100_000 + b"]" * 100_000,
            b'{"prompt": "\\ud800"}',
            b'{"prompt": "x", "n": 1180591620717411303424}',
            b'{"prompt": "x", "n": -1}',
            b'{"prompt": "x", "n": 1e400}',
            b'{"prompt": ' + b'"a' * 10 + b'"}',
        ]
    )
    bodies = st.one_of(
        tricky, st.binary(max_size=200), st.recursive(st.text(max_size=8), st.lists).map(repr).map(str.encode)
    )
    seen: list[int] = []

    @settings(FUZZ, max_examples=40)
    @given(body=bodies, where=st.one_of(st.none(), HEADER_TEXT), worker=st.one_of(st.none(), HEADER_TEXT))
    def fuzz(body, where, worker):
        headers = {k: v for k, v in {"x-edge-client-location": where, "x-edge-worker": worker}.items() if v}
        r = httpx.post(server.url + "/", content=body, headers=headers, timeout=60)
        seen.append(r.status_code)
        assert r.status_code < 500, (body[:80], headers, r.text[:300])

    fuzz()
    for body in tricky.elements:  # each of these at least once, whatever was drawn
        r = httpx.post(server.url + "/", content=body, timeout=60)
        seen.append(r.status_code)
        assert r.status_code == 400, (body[:80], r.text[:300])
    print(f"\nfuzz: {len(seen)} inputs at the worker front door, {sum(s >= 500 for s in seen)} answered 5xx")
