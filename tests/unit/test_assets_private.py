"""Static assets never serve the project's private files (secrets, configs, state, git), however the
path is spelled, with `assets.directory = "."`: the worker beside its index.html, a common layout."""

import os
import textwrap
from urllib.parse import quote, unquote

import httpx
import pytest

from runtime.host.assets import HTML_HANDLING, AssetServer

SECRET = b"SECRET_TOKEN=s3cr3t-do-not-serve"
PRIVATE = [  # the files, as a user's project holds them
    ".dev.vars",
    ".dev.vars.staging",
    ".env",
    ".env.local",
    "wrangler.toml",
    "wrangler.json",
    "wrangler.jsonc",
    "wrangler-like.toml",
    ".edge/state.db",
    ".git/config",
    ".assetsignore",
]
PUBLIC = {
    "/.well-known/security.txt": b"Contact: mailto:security@example.com",
    "/.hidden-but-public.txt": b"a dot file, but public",
    "/env.txt": b"not .env",
    "/dev.vars.txt": b"not .dev.vars",
    "/wrangler.md": b"how we deploy",
    "/static/app.js": b"console.log(1)",
}
INDEX = b"<h1>home</h1>"


def _upper(path: str) -> str:
    return path.upper()


def _trailing_dot(path: str) -> str:  # Windows drops a trailing dot: `.env.` opens `.env` there
    first, sep, rest = path[1:].partition("/")
    return f"/{first}.{sep}{rest}"


# Each spelling, as a client sends it (percent-encoded); the server sees it decoded.
SPELLINGS = {
    "plain": lambda p: p,
    "encoded-dot": lambda p: p.replace("/.", "/%2E").replace("/w", "/%77"),
    "all-encoded": lambda p: "/" + "".join(f"%{b:02x}" for b in p[1:].encode()),
    "dot-segment": lambda p: "/." + p,
    "dot-dot-segment": lambda p: "/static/.." + p,
    "double-slashes": lambda p: "/" + p.replace("/", "//"),
    "trailing-slash": lambda p: p + "/",
    "upper-case": _upper,
    "trailing-dot": _trailing_dot,
}
# Spellings that reach the file only on a case-insensitive (macOS, Windows) or dot-trimming
# (Windows) filesystem: the fixture gives them a file of their own with the same secret, so the
# test means the same on Linux.
ALIASED = {"upper-case": _upper, "trailing-dot": _trailing_dot}


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    d = tmp_path_factory.mktemp("project")
    (d / "worker.py").write_text("from workers import WorkerEntrypoint\n")
    (d / "index.html").write_bytes(INDEX)
    for name in PRIVATE:
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(SECRET)
    for path, body in PUBLIC.items():
        (d / path[1:]).parent.mkdir(parents=True, exist_ok=True)
        (d / path[1:]).write_bytes(body)
    for name in PRIVATE:
        for alias in ALIASED.values():
            spelled = d / alias("/" + name)[1:]
            spelled.parent.mkdir(parents=True, exist_ok=True)
            spelled.write_bytes(SECRET)  # on a case-insensitive disk: the same file, rewritten
    # symlinks with public names that lead to private files, or through private folders
    os.symlink(d / ".dev.vars", d / "notes.txt")
    os.symlink(d / ".env.local", d / "static" / "settings.txt")
    os.symlink(d / "wrangler.jsonc", d / "config.json")
    os.symlink(d / ".git", d / "repo")
    os.symlink(d / ".edge", d / "state")
    return d


def _assert_refused(root, html_handling, url_path):
    """Answered as a missing file is: the worker's (None), the binding's 404, or the SPA's index."""
    path = unquote(url_path)  # what the HTTP server hands on
    plain = AssetServer(root, html_handling, "none")
    spa = AssetServer(root, html_handling, "single-page-application")
    assert plain.serve("GET", path, {}) is None, url_path
    assert plain.serve("HEAD", path, {}) is None, url_path
    missing = plain.fetch("GET", "https://assets.local" + url_path, {})
    assert (missing.status, missing.body) == (404, b"Not Found"), url_path
    page = spa.serve("GET", path, {"sec-fetch-mode": "navigate"})
    assert (page.status, page.body) == (200, INDEX), url_path
    via = spa.fetch("GET", "https://assets.local" + url_path, {})
    assert (via.status, via.body) == (200, INDEX), url_path


@pytest.mark.parametrize("html_handling", HTML_HANDLING)
@pytest.mark.parametrize("spelling", SPELLINGS)
@pytest.mark.parametrize("name", PRIVATE)
def test_no_spelling_of_a_private_file_is_served(project, name, spelling, html_handling):
    _assert_refused(project, html_handling, SPELLINGS[spelling]("/" + name))


@pytest.mark.parametrize("html_handling", HTML_HANDLING)
@pytest.mark.parametrize(
    "url_path",
    [
        "/notes.txt",  # -> .dev.vars
        "/static/settings.txt",  # -> .env.local
        "/config.json",  # -> wrangler.jsonc
        "/repo/config",  # -> .git/config
        "/state/state.db",  # -> .edge/state.db
        "/%6eotes.txt",
        "/./repo//config",
    ],
)
def test_a_symlink_to_a_private_file_is_not_served(project, url_path, html_handling):
    _assert_refused(project, html_handling, url_path)


@pytest.mark.parametrize("name", [".dev.vars", ".env", ".git", ".edge"])
def test_html_handling_lookups_reach_no_private_file(tmp_path, name):
    """`/.env` also looks for `/.env.html` (private as `.env.*` is) and `/.env/index.html`."""
    (tmp_path / name).mkdir()
    (tmp_path / name / "index.html").write_bytes(SECRET)
    if name in (".dev.vars", ".env"):
        (tmp_path / f"{name}.html").write_bytes(SECRET)
    (tmp_path / "index.html").write_bytes(INDEX)
    for mode in HTML_HANDLING:
        for path in (f"/{name}", f"/{name}/", f"/{name}.html", f"/{name}/index.html"):
            _assert_refused(tmp_path, mode, path)


@pytest.mark.parametrize("html_handling", HTML_HANDLING)
@pytest.mark.parametrize("path", PUBLIC)
def test_public_files_and_dot_paths_still_serve(project, path, html_handling):
    server = AssetServer(project, html_handling)
    got = server.serve("GET", path, {})
    assert got is not None and got.status == 200 and got.body == PUBLIC[path]
    assert server.fetch("GET", "https://assets.local" + quote(path), {}).body == PUBLIC[path]
    encoded = path.replace("/.", "/%2E")
    assert server.fetch("GET", "https://assets.local" + encoded, {}).body == PUBLIC[path]


def test_the_index_and_the_worker_source_still_serve(project):
    server = AssetServer(project)
    assert server.serve("GET", "/", {}).body == INDEX
    assert server.serve("GET", "/worker.py", {}).status == 200


# --- over HTTP, through a real `edge dev` --------------------------------------------------------


@pytest.mark.slow
def test_edge_dev_does_not_serve_dev_vars_from_a_project_served_as_assets(tmp_path):
    from tests.integration.dev_server import DevServer

    (tmp_path / "worker.py").write_text(
        textwrap.dedent("""
        from urllib.parse import urlsplit

        from workers import Response, WorkerEntrypoint


        class Default(WorkerEntrypoint):
            async def fetch(self, request):
                return Response("worker: " + urlsplit(request.url).path)
        """)
    )
    (tmp_path / "index.html").write_bytes(INDEX)
    (tmp_path / ".dev.vars").write_bytes(SECRET + b"\n")
    (tmp_path / ".well-known").mkdir()
    (tmp_path / ".well-known" / "security.txt").write_bytes(PUBLIC["/.well-known/security.txt"])
    (tmp_path / "wrangler.jsonc").write_text(
        '{"name": "site", "main": "worker.py", "compatibility_date": "2026-11-01",'
        ' "assets": {"directory": "."}}'
    )
    with DevServer(tmp_path / "wrangler.jsonc", cwd=tmp_path) as srv:
        for path in ("/.dev.vars", "/%2edev.vars", "/%2Edev%2Evars", "/.DEV.VARS", "/wrangler.jsonc"):
            r = httpx.get(srv.url + path, timeout=30)
            assert SECRET not in r.content and b"s3cr3t" not in r.content, path
            assert r.text.startswith("worker: "), (path, r.text)  # a miss: the worker answered
        r = httpx.get(srv.url + "/.well-known/security.txt", timeout=30)
        assert r.status_code == 200 and r.content == PUBLIC["/.well-known/security.txt"]
        assert httpx.get(srv.url + "/", timeout=30).content == INDEX
