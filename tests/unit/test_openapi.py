"""The OpenAPI document: served, valid 3.1 in shape, and complete: every route the app serves (the
router walked, the catch-alls aside) is in it with each of its methods."""

import re
import textwrap

import pytest
from starlette.routing import Route
from starlette.testclient import TestClient

from runtime.app import Runtime, create_app
from runtime.control.config import parse_config
from runtime.routes.openapi import PATH, document


@pytest.fixture
def app(tmp_path, icn_edge):
    (tmp_path / "worker.py").write_text("from workers import WorkerEntrypoint\n")
    config = parse_config(
        'name = "doc"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n', base_dir=tmp_path
    )
    rt = Runtime(config, icn_edge, admin_token="adm-token")
    yield create_app(rt)
    rt.state.close()
    rt.bindings.close()


CATCH_ALLS = {"/client/v4{rest:path}", "/cdn-cgi{rest:path}", "/{path:path}"}


def served(app) -> set[tuple[str, str]]:
    out = set()
    for route in app.routes:
        if not isinstance(route, Route) or route.path in CATCH_ALLS:
            continue
        path = re.sub(r"\{(\w+):\w+\}", r"{\1}", route.path)  # {model:path} is {model} in OpenAPI
        out |= {(path, m.lower()) for m in route.methods or () if m != "HEAD"}
    return out


def test_every_served_route_is_in_the_document(app):
    doc = TestClient(app).get(PATH)
    assert doc.status_code == 200 and doc.json()["openapi"] == "3.1.0"
    described = {(path, method) for path, ops in doc.json()["paths"].items() for method in ops}
    routes = served(app)
    assert len(routes) > 20
    assert routes - described == set(), "served but not described"
    assert described - routes == set(), "described but not served"


def test_request_bodies_come_from_the_structs_and_every_ref_resolves():
    doc = document()
    schemas = doc["components"]["schemas"]
    chat = schemas["ChatCompletionRequest"]
    assert set(chat["required"]) == {"model", "messages"} and "seed" in chat["properties"]
    assert schemas["Upload"]["additionalProperties"] is False  # forbid_unknown_fields, as decoded
    refs = set(re.findall(r'"#/components/schemas/(\w+)"', str(doc).replace("'", '"')))
    assert refs and refs <= set(schemas), refs - set(schemas)
    for path, ops in doc["paths"].items():
        params = set(re.findall(r"\{(\w+)\}", path))
        for op in ops.values():
            assert {p["name"] for p in op["parameters"] if p["in"] == "path"} == params, path
            assert "default" in op["responses"] or path == PATH, textwrap.shorten(path, 60)
