"""The pytest plugin (entry point `pytest11: edge_workers`): its options, markers, fixtures and the
runner of `async def` tests that use the worker. Nothing here starts before a test asks for
`worker`: the project's own suite, or any other, runs as it did.

Options (command line; the ini keys in [tool.pytest.ini_options] or pytest.ini):
  --edge-config PATH / edge_config       the project's config (default: the first wrangler.json,
                                         wrangler.jsonc, wrangler.toml or wrangler-like.toml in the
                                         test file's folder or one above it, up to the rootdir)
  --edge-ai-seed N|none / edge_ai_seed   the seed every AI call without its own gets (default 0;
                                         none: unseeded, each answer differs)
  --edge-insecure-isolation              run workers without namespaces (edge dev's flag of that name)
  --edge-compile                         compile the engines' decode steps ($EDGE_COMPILE; default eager)
  --edge-test-timeout S / edge_test_timeout
                                         how long an async test that uses `worker`, or one
                                         worker.run(...), may run before it fails (default 300;
                                         0: no limit): a last guard, so that no test waits forever
Markers:
  @pytest.mark.edge_config("path")       this test's project (relative to the test file's folder)
  @pytest.mark.edge_ai_seed(7)           this test's seed (None: unseeded)
Fixtures:
  worker         runtime.testing.EdgeWorker: the project's worker, fresh state, for one test
  edge_config    the config path the test runs (override it in a conftest.py to choose another)
  edge_session   the session's loop and started projects (one model load per project)
"""

from __future__ import annotations

import inspect
import secrets
from pathlib import Path

import pytest

# Only pytest and the standard library at import: pytest loads this plugin in every session of the
# environment, and the runtime (torch included) is imported by the first test that uses `worker`.

DEFAULT_AI_SEED = 0
DEFAULT_TEST_TIMEOUT_S = 300.0  # a real model answers in seconds; minutes mean a test that hangs


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("edge-workers", "testing an edge-workers project (runtime.testing)")
    group.addoption("--edge-config", default=None, help="the worker project's config file")
    group.addoption(
        "--edge-ai-seed",
        default=None,
        help=f"the seed of every AI call without its own (an integer, or none; default {DEFAULT_AI_SEED})",
    )
    group.addoption(
        "--edge-insecure-isolation",
        action="store_true",
        help="run workers without namespaces (for kernels that refuse user namespaces); unsafe",
    )
    group.addoption(
        "--edge-compile", action="store_true", help="compile the engines' decode steps (default: eager)"
    )
    group.addoption(
        "--edge-test-timeout",
        default=None,
        help="seconds an async test using `worker` (or one worker.run) may run before it fails "
        f"(default {DEFAULT_TEST_TIMEOUT_S:g}; 0: no limit)",
    )
    parser.addini("edge_config", "the worker project's config file (relative to this ini file)")
    parser.addini("edge_ai_seed", f"the seed of every AI call without its own (default {DEFAULT_AI_SEED})")
    parser.addini(
        "edge_test_timeout",
        f"seconds an async test using `worker` may run (default {DEFAULT_TEST_TIMEOUT_S:g}; 0: no limit)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "edge_config(path): the worker project this test runs (relative to the test file)"
    )
    config.addinivalue_line(
        "markers", "edge_ai_seed(seed): the seed of this test's AI calls without their own (None: unseeded)"
    )
    # The runner of async tests is registered now, after every plugin pytest loaded at start, so
    # that its tryfirst hook is called before theirs (pluggy calls the last registered first): an
    # `async def` test that uses `worker` and is marked for anyio (whose plugin is installed with
    # httpx) runs on the worker's loop, where the worker answers, instead of on anyio's, where its
    # awaits would wait forever.
    config.pluginmanager.register(AsyncTestRunner(), "edge_workers.async_tests")


def _seed(value: object, where: str) -> int | None:
    if value is None or (isinstance(value, str) and value.strip().lower() == "none"):
        return None
    try:
        return int(value)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        raise pytest.UsageError(f"{where}: expected an integer or none, got {value!r}") from None


def timeout_of(config: pytest.Config) -> float | None:
    """--edge-test-timeout, else the ini's edge_test_timeout, else the default; None: no limit."""
    given, where = config.getoption("edge_test_timeout"), "--edge-test-timeout"
    if given is None:
        given, where = config.getini("edge_test_timeout") or None, "edge_test_timeout (ini)"
    if given is None:
        return DEFAULT_TEST_TIMEOUT_S
    try:
        seconds = float(given)
    except ValueError:
        raise pytest.UsageError(f"{where}: expected seconds (0: no limit), got {given!r}") from None
    return seconds if seconds > 0 else None


def ai_seed_for(request: pytest.FixtureRequest) -> int | None:
    marker = request.node.get_closest_marker("edge_ai_seed")
    if marker is not None:
        if len(marker.args) != 1:
            raise pytest.UsageError("@pytest.mark.edge_ai_seed takes one argument: the seed, or None")
        return _seed(marker.args[0], "@pytest.mark.edge_ai_seed")
    given = request.config.getoption("edge_ai_seed")
    if given is not None:
        return _seed(given, "--edge-ai-seed")
    ini = request.config.getini("edge_ai_seed")
    return _seed(ini, "edge_ai_seed (ini)") if ini else DEFAULT_AI_SEED


@pytest.fixture(scope="session")
def edge_session(pytestconfig: pytest.Config):
    """The session's event loop and the projects started so far (each project's models load once)."""
    from runtime.testing.edges import EdgeSession

    session = EdgeSession(
        insecure_isolation=pytestconfig.getoption("edge_insecure_isolation"),
        compile_steps=pytestconfig.getoption("edge_compile"),
    )
    yield session
    session.close()


@pytest.fixture
def edge_config(request: pytest.FixtureRequest) -> Path:
    """The config of the project the test runs: its edge_config marker, else --edge-config, else
    the ini's edge_config, else the first config found from the test file's folder up to the rootdir."""
    marker = request.node.get_closest_marker("edge_config")
    if marker is not None:
        if len(marker.args) != 1:
            raise pytest.UsageError("@pytest.mark.edge_config takes one argument: the config's path")
        return (request.path.parent / marker.args[0]).resolve()
    given = request.config.getoption("edge_config")
    if given:
        return (request.config.invocation_params.dir / given).resolve()
    ini = request.config.getini("edge_config")
    if ini:
        base = request.config.inipath.parent if request.config.inipath else request.config.rootpath
        return (base / ini).resolve()
    from runtime.testing.project import find_project_config

    found = find_project_config(request.path.parent, request.config.rootpath)
    if found is None:
        pytest.fail(
            f"no worker project for {request.path.name}: no wrangler.json, wrangler.jsonc, wrangler.toml "
            "or wrangler-like.toml in its folder or above it; pass --edge-config PATH or mark the test "
            '@pytest.mark.edge_config("path/to/wrangler.jsonc")',
            pytrace=False,
        )
    return found


@pytest.fixture
def worker(request: pytest.FixtureRequest, edge_session, edge_config: Path, tmp_path: Path):
    """The project's worker in a real isolate, with its own empty state under tmp_path and the
    session's edge (real models), for this test. See runtime.testing.EdgeWorker."""
    from runtime.app import Runtime
    from runtime.testing.edges import EdgeStartError, SharedEdge, settle
    from runtime.testing.project import with_state_dir
    from runtime.testing.worker import BASE_URL, EdgeWorker, WorkerLoadError

    try:
        project = edge_session.project(edge_config)
    except EdgeStartError as exc:
        pytest.fail(str(exc), pytrace=False)
    loop = edge_session.loop
    config = with_state_dir(project.config, tmp_path / "edge-state")
    admin_token = secrets.token_urlsafe(24)
    runtime = Runtime(
        config,
        SharedEdge(project.edge),
        catalog=project.catalog,
        deps=project.deps,
        admin_token=admin_token,
        origin=BASE_URL,  # where the test's requests go: the URLs the worker is given name it
    )
    client = EdgeWorker(
        runtime, loop, str(edge_config), ai_seed=ai_seed_for(request), timeout=timeout_of(request.config)
    )
    client.admin_token = admin_token
    try:
        loop.run_until_complete(client.start())
    except WorkerLoadError as exc:
        loop.run_until_complete(client.close())
        settle(loop)
        pytest.fail(str(exc), pytrace=False)
    try:
        yield client
    finally:
        loop.run_until_complete(client.close())
        settle(loop)


class AsyncTestRunner:
    """Runs an `async def` test that uses `worker` on the session's loop, the loop its worker lives
    on (no pytest-asyncio needed), whether or not it is also marked for anyio; any other test is
    left to pytest and other plugins. Registered in pytest_configure (see there why)."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_pyfunc_call(self, pyfuncitem: pytest.Function) -> bool | None:
        if not inspect.iscoroutinefunction(pyfuncitem.obj) or "worker" not in pyfuncitem.fixturenames:
            return None
        from runtime.testing.edges import EdgeSession
        from runtime.testing.worker import run_within

        session = pyfuncitem.funcargs.get("edge_session")
        if not isinstance(session, EdgeSession):
            return None  # `worker` is a fixture of the test's own, not ours
        names = pyfuncitem._fixtureinfo.argnames
        test = pyfuncitem.obj(**{name: pyfuncitem.funcargs[name] for name in names})
        run_within(session.loop, test, timeout_of(pyfuncitem.config), pyfuncitem.name)
        return True
