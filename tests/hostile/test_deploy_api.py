"""The deploy API against a hostile caller holding a valid token, on a real `edge dev`: limits
past their range, another worker's versions, and bundles with odd file names are all refused with
a 400 naming the key or path, the active version is unchanged and nothing is left in staging; a
bad client_location stops `edge dev` with a clear error instead of a traceback."""

import os
import subprocess
import sys
import textwrap

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

WORKER = 'from workers import Response\n\nasync def on_fetch(request, env):\n    return Response("{name}")\n'
CONFIG = """
name = "app"
main = "worker.py"
compatibility_date = "2026-11-01"
[edge]
client_location = "{location}"
pops = ["ICN"]
models = ["@edge/moonshotai/kimi-k2-mini"]
models_dir = "{models}"
"""


def _write_project(d, location="Seoul"):
    (d / "worker.py").write_text(WORKER.format(name="app"))
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent(CONFIG.format(location=location, models=REPO / "models"))
    )
    return d / "wrangler-like.toml"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile-deploy")
    with DevServer(_write_project(d), cwd=d) as srv:
        srv.token = (d / ".edge" / "api-token").read_text().strip()
        srv.edge = d / ".edge"
        yield srv


def put(server, name, files=None, main="worker.py", config=None, **extra):
    body = {"main": main, "files": files or {"worker.py": WORKER.format(name=name)}, **extra}
    if config is not None:
        body["config"] = config
    return call(server, "PUT", f"/workers/scripts/{name}", json=body)


def call(server, method, path, **kw):
    url = f"{server.url}/client/v4/accounts/local{path}"
    return httpx.request(method, url, headers={"authorization": f"Bearer {server.token}"}, timeout=120, **kw)


def error(r) -> tuple[int, str]:
    body = r.json()
    assert body["success"] is False and body["result"] is None
    return body["errors"][0]["code"], body["errors"][0]["message"]


def leftovers(server) -> list[str]:
    staging = server.edge / "staging"
    return sorted(p.name for p in staging.iterdir()) if staging.exists() else []


def versions(server, name) -> list[str]:
    return [
        v["id"] for v in call(server, "GET", f"/workers/scripts/{name}/versions").json()["result"]["items"]
    ]


def serve(server, name) -> str:
    return httpx.get(server.url + "/", headers={"x-edge-worker": f"local/{name}"}, timeout=60).text


# --- limits ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "key", "words"),
    [
        ({"cpu_ms": 10**12}, "config.cpu_ms", "must be an integer between 1 and 300000, got 1000000000000"),
        ({"cpu_ms": 0}, "config.cpu_ms", "between 1 and 300000"),
        ({"memory_mb": 0}, "config.memory_mb", "between 16 and 1024, got 0"),  # 0 is not "unlimited"
        ({"memory_mb": 1 << 20}, "config.memory_mb", "between 16 and 1024"),
        ({"subrequests": 10**6}, "config.subrequests", "between 1 and 1000"),
        ({"cpu_ms": True}, "config.cpu_ms", "expected `int`, got `bool`"),
        ({"memory_mb": 128.0}, "config.memory_mb", "expected `int`, got `float`"),
        ({"cpu_time": 5}, "config", "unknown field `cpu_time`"),
        ({"services": {"not valid": "app"}}, "config.services", "not a valid Python identifier"),
    ],
)
def test_limits_raised_through_the_deploy_api_are_refused(server, config, key, words):
    r = put(server, "limited", config=config)
    code, message = error(r)
    assert r.status_code == 400 and code == 10014, r.text
    assert message.startswith(key + ":") and words in message and "unchanged" in message
    assert versions(server, "limited") == [] and leftovers(server) == []


def test_limits_in_range_deploy_and_are_stored_validated(server):
    r = put(server, "bounded", config={"cpu_ms": 300_000, "memory_mb": 16, "subrequests": 1000})
    assert r.status_code == 200, r.text
    assert serve(server, "bounded") == "bounded" and leftovers(server) == []
    folder = server.edge / "scripts" / r.json()["result"]["id"]
    assert oct(folder.stat().st_mode & 0o777) == "0o755"  # readable by the isolate's uid
    assert oct((folder / "worker.py").stat().st_mode & 0o777) == "0o644"


# --- another worker's versions ----------------------------------------------------------------------


def test_rollback_and_deploys_take_only_the_workers_own_versions(server):
    assert put(server, "alpha").status_code == 200
    assert put(server, "beta").status_code == 200
    (alpha,), (beta,) = versions(server, "alpha"), versions(server, "beta")

    r = call(server, "POST", "/workers/scripts/beta/rollback", json={"version_id": alpha})
    code, message = error(r)
    assert (r.status_code, code) == (404, 10007) and alpha in message and "worker 'beta'" in message

    split = {"versions": [{"version_id": alpha, "percentage": 100}]}
    r = call(server, "POST", "/workers/scripts/beta/deployments", json=split)
    code, message = error(r)
    assert (r.status_code, code) == (404, 10007) and alpha in message and "worker 'beta'" in message

    half = {"versions": [{"version_id": beta, "percentage": 50}, {"version_id": alpha, "percentage": 50}]}
    assert call(server, "POST", "/workers/scripts/beta/deployments", json=half).status_code == 404
    assert serve(server, "beta") == "beta" and serve(server, "alpha") == "alpha"
    r = call(server, "POST", "/workers/scripts/beta/rollback", json={"version_id": beta})
    assert r.status_code == 200 and r.json()["result"]["version_id"] == beta  # its own is fine


# --- odd bundles ------------------------------------------------------------------------------------

MAIN = WORKER.format(name="odd")


@pytest.mark.parametrize(
    ("files", "main", "named"),
    [
        ({".": "", "worker.py": MAIN}, "worker.py", "'.'"),
        ({"..": "", "worker.py": MAIN}, "worker.py", "'..'"),
        ({"a/../../x.py": "", "worker.py": MAIN}, "worker.py", "'a/../../x.py'"),
        ({"./worker.py": MAIN}, "./worker.py", "'./worker.py'"),
        ({"": "", "worker.py": MAIN}, "worker.py", "empty"),
        ({"/tmp/abs.py": "", "worker.py": MAIN}, "worker.py", "'/tmp/abs.py'"),
        ({"a//b.py": "", "worker.py": MAIN}, "worker.py", "'a//b.py'"),
        ({"lib/": "", "worker.py": MAIN}, "worker.py", "'lib/'"),  # a name that is a folder
        ({"lib": "", "lib/x.py": "", "worker.py": MAIN}, "worker.py", "'lib' is both a file and the folder"),
        ({"worker.py/x.py": "", "worker.py": MAIN}, "worker.py", "'worker.py' is both"),
        ({"a\x00b.py": "", "worker.py": MAIN}, "worker.py", r"'a\x00b.py'"),
        ({"a\nb.py": "", "worker.py": MAIN}, "worker.py", r"'a\nb.py'"),
        ({"a\u202eb.py": "", "worker.py": MAIN}, "worker.py", "control characters"),
        ({"a\\b.py": "", "worker.py": MAIN}, "worker.py", "backslashes"),
        ({"x" * 256 + ".py": "", "worker.py": MAIN}, "worker.py", "at most 255 bytes"),
        ({"worker.py": MAIN}, "missing.py", "main: 'missing.py' is not among"),
        ({"worker.txt": MAIN}, "worker.txt", "main: 'worker.txt' is not a Python module"),
    ],
)
def test_odd_file_names_are_refused_and_leave_nothing_behind(server, files, main, named):
    r = put(server, "odd", files=files, main=main)
    code, message = error(r)
    assert (r.status_code, code) == (400, 10014), r.text
    assert named in message and "unchanged" in message
    assert versions(server, "odd") == [] and leftovers(server) == []


def test_too_many_files_or_too_much_source_is_refused(server):
    many = {f"m{i}.py": "" for i in range(257)} | {"worker.py": MAIN}
    r = put(server, "big", files=many)
    assert r.status_code == 413 and "at most 256" in error(r)[1]
    huge = {"worker.py": MAIN, "blob.py": "#" * (10 * 1024 * 1024)}
    r = put(server, "big", files=huge)
    assert r.status_code == 413 and "at most 10485760" in error(r)[1]
    assert versions(server, "big") == [] and leftovers(server) == []


def test_unknown_top_level_keys_and_a_broken_script_leave_nothing_behind(server):
    r = put(server, "odd2", surprise=1)
    assert r.status_code == 400 and "unknown field `surprise`" in error(r)[1]
    r = put(server, "odd2", files={"worker.py": "def broken(:\n"})
    assert r.status_code == 400 and error(r)[0] == 10021 and "SyntaxError" in error(r)[1]
    assert versions(server, "odd2") == [] and leftovers(server) == []


# --- config checked against the topology -------------------------------------------------------------


def test_a_bad_client_location_stops_edge_dev_with_a_clear_error(tmp_path):
    config = _write_project(tmp_path, location="Atlantis")
    run = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "dev", "--config", str(config), "--port", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert run.returncode != 0
    assert "edge.client_location: unknown location 'Atlantis'" in run.stderr
    assert "PoP city" in run.stderr and "lat,lon" in run.stderr  # says what is accepted
    assert "Traceback" not in run.stderr + run.stdout
