"""A model's weights overwritten on disk while it serves (bytes changed in place in a copy of the
shipped miniature): the admin reload refuses the new file (the signed manifest no longer matches)
and the weights already loaded keep serving: the same greedy answer before and after."""

import shutil

import httpx
import pytest

from tests.faults.project import MODEL, token, write_project
from tests.integration.dev_server import REPO, DevServer


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("model-replaced")
    # Beside the worker's folder, not in it: the shipped models exceed an isolate folder's 32 MB.
    models = tmp_path_factory.mktemp("model-replaced-models") / "models"
    shutil.copytree(REPO / "models", models)
    with DevServer(write_project(folder, models_dir=models), cwd=folder) as srv:
        srv.folder, srv.models = folder, models
        yield srv


def answer(server) -> str:
    r = httpx.get(server.url + "/generate?n=12", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["response"]


def test_a_tampered_model_is_refused_on_reload_and_the_old_weights_keep_serving(server):
    before = answer(server)
    weights = server.models / "kimi-k2-mini" / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as f:  # in place: a server that mapped the file would see it change
        f.seek(size // 2)
        chunk = f.read(4096)
        f.seek(size // 2)
        f.write(bytes(b ^ 0x5A for b in chunk))
    assert answer(server) == before  # what was loaded is not read from the file again

    r = httpx.post(
        server.url + "/cdn-cgi/edge/models/reload",
        json={"model": MODEL},
        headers=token(server.folder, "admin-token"),
        timeout=120,
    )
    assert r.status_code == 409, r.text
    icn = r.json()["pops"]["ICN"]
    assert icn["loaded"] is False and "model.safetensors" in icn["refused"], icn
    assert answer(server) == before
    health = httpx.get(server.url + "/cdn-cgi/edge/health", timeout=60).json()
    assert MODEL in health["models"]
