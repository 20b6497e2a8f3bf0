"""Static assets: which file a path serves, content types, ETag/304, html_handling, not_found_handling,
run_worker_first, and no way out of the folder (.., encoded .., symlinks, the runtime's state)."""

import os

import pytest

from runtime.host.assets import AssetServer, content_type


@pytest.fixture
def site(tmp_path):
    root = tmp_path / "public"
    (root / "docs").mkdir(parents=True)
    (root / "index.html").write_text("<h1>home</h1>")
    (root / "about.html").write_text("<h1>about</h1>")
    (root / "docs" / "index.html").write_text("<h1>docs</h1>")
    (root / "docs" / "404.html").write_text("no such doc")
    (root / "404.html").write_text("no such page")
    (root / "style.css").write_text("body{}")
    (root / "app.js").write_text("1")
    (root / "logo.png").write_bytes(b"\x89PNG")
    (root / "data.json").write_text("{}")
    (root / "blob").write_bytes(b"\0\1")
    (root / ".assetsignore").write_text("secret\n")
    (tmp_path / "secret.txt").write_text("outside")
    return root


def get(server, path, **headers):
    return server.serve("GET", path, {k.replace("_", "-"): v for k, v in headers.items()})


def header(response, name):
    return dict(response.headers).get(name)


@pytest.mark.parametrize(
    "name, kind",
    [
        ("a.html", "text/html; charset=utf-8"),
        ("a.css", "text/css; charset=utf-8"),
        ("a.js", "charset=utf-8"),
        ("a.json", "application/json; charset=utf-8"),
        ("a.png", "image/png"),
        ("a.svg", "image/svg+xml; charset=utf-8"),
        ("noext", "application/octet-stream"),
    ],
)
def test_content_types(name, kind):
    from pathlib import Path

    assert kind in content_type(Path(name))


def test_a_file_is_served_with_its_type_etag_and_304(site):
    server = AssetServer(site)
    r = get(server, "/style.css")
    assert r.status == 200 and r.body == b"body{}"
    assert header(r, "content-type") == "text/css; charset=utf-8"
    etag = header(r, "etag")
    assert etag.startswith('"') and etag.endswith('"') and len(etag) > 10
    assert header(r, "cache-control") == "public, max-age=0, must-revalidate"
    again = get(server, "/style.css", if_none_match=etag)
    assert again.status == 304 and again.body == b"" and header(again, "etag") == etag
    assert get(server, "/style.css", if_none_match=f'W/{etag}, "other"').status == 304
    assert get(server, "/style.css", if_none_match='"stale"').status == 200
    (site / "style.css").write_text("body{color:red}")
    changed = get(server, "/style.css", if_none_match=etag)
    assert changed.status == 200 and header(changed, "etag") != etag


def test_auto_trailing_slash_serves_index_and_pages(site):
    server = AssetServer(site)
    assert get(server, "/").body == b"<h1>home</h1>"
    assert get(server, "/about").body == b"<h1>about</h1>"
    assert get(server, "/docs/").body == b"<h1>docs</h1>"
    for path, location in [
        ("/docs", "/docs/"),
        ("/about.html", "/about"),
        ("/about/", "/about"),
        ("/docs/index.html", "/docs/"),
        ("/index.html", "/"),
    ]:
        r = get(server, path)
        assert (r.status, header(r, "location")) == (307, location), path
    r = server.serve("GET", "/docs", {}, query="a=1")
    assert header(r, "location") == "/docs/?a=1"


def test_other_html_handling_modes(site):
    force = AssetServer(site, html_handling="force-trailing-slash")
    assert header(get(force, "/about"), "location") == "/about/"
    assert get(force, "/about/").body == b"<h1>about</h1>"
    drop = AssetServer(site, html_handling="drop-trailing-slash")
    assert get(drop, "/docs").body == b"<h1>docs</h1>"
    assert header(get(drop, "/docs/"), "location") == "/docs"
    none = AssetServer(site, html_handling="none")
    assert get(none, "/about") is None
    assert get(none, "/about.html").body == b"<h1>about</h1>"
    with pytest.raises(ValueError, match="html_handling"):
        AssetServer(site, html_handling="sometimes")


def test_a_miss_goes_to_the_worker_and_navigations_get_the_fallback(site):
    assert get(AssetServer(site), "/api/users") is None
    spa = AssetServer(site, not_found_handling="single-page-application")
    assert get(spa, "/api/users") is None  # a fetch() from the page: the worker's
    r = get(spa, "/app/settings", sec_fetch_mode="navigate")
    assert r.status == 200 and r.body == b"<h1>home</h1>"
    pages = AssetServer(site, not_found_handling="404-page")
    r = get(pages, "/docs/missing/deep", sec_fetch_mode="navigate")
    assert r.status == 404 and r.body == b"no such doc"  # the nearest 404.html
    assert get(pages, "/nope", sec_fetch_mode="navigate").body == b"no such page"


def test_the_binding_applies_not_found_handling_to_every_miss(site):
    plain = AssetServer(site)
    assert plain.fetch("GET", "https://assets.local/missing", {}).status == 404
    assert plain.fetch("GET", "https://x/about", {}).body == b"<h1>about</h1>"
    assert plain.fetch("GET", "/style.css", {}).status == 200  # a bare path works too
    assert plain.fetch("POST", "https://x/style.css", {}).status == 405
    head = plain.fetch("HEAD", "https://x/style.css", {})
    assert head.status == 200 and head.body == b"" and header(head, "etag")
    spa = AssetServer(site, not_found_handling="single-page-application")
    assert spa.fetch("GET", "https://x/anything", {}).body == b"<h1>home</h1>"
    assert AssetServer(site, not_found_handling="404-page").fetch("GET", "https://x/z", {}).status == 404


def test_other_methods_and_run_worker_first_reach_the_worker(site):
    assert AssetServer(site).serve("POST", "/style.css", {}) is None
    assert get(AssetServer(site, run_worker_first=True), "/style.css") is None
    some = AssetServer(site, run_worker_first=["/docs/*", "!/docs/404.html"])
    assert get(some, "/docs/") is None
    assert get(some, "/docs/404.html") is not None  # excluded: the assets answer (a redirect here)
    assert get(some, "/style.css").status == 200


@pytest.mark.parametrize(
    "path",
    [
        "/../secret.txt",
        "/docs/../../secret.txt",
        "/..%2fsecret.txt",
        "/%2e%2e/secret.txt",
        "/docs/..\\..\\secret.txt",
        "/.assetsignore",
        "/style.css\x00.png",
        "//etc/passwd",
    ],
)
def test_no_path_leaves_the_folder(site, path):
    from urllib.parse import unquote

    server = AssetServer(site)
    assert get(server, path) is None
    assert get(server, unquote(path)) is None  # decoded once more: still nothing
    assert server.fetch("GET", "https://x" + path, {}).status == 404


def test_symlinks_out_of_the_folder_are_refused_and_inside_it_followed(site):
    outside = site.parent / "secret.txt"
    os.symlink(outside, site / "leak.txt")
    os.symlink(site.parent, site / "up")
    os.symlink(site / "style.css", site / "alias.css")
    server = AssetServer(site)
    assert get(server, "/leak.txt") is None
    assert get(server, "/up/secret.txt") is None
    assert server.fetch("GET", "https://x/leak.txt", {}).status == 404
    assert get(server, "/alias.css").body == b"body{}"


def test_the_runtime_state_is_never_served_even_when_the_folder_holds_it(tmp_path):
    (tmp_path / ".edge").mkdir()
    (tmp_path / ".edge" / "admin-token").write_text("s3cret")
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "db").write_text("rows")
    (tmp_path / "index.html").write_text("hi")
    server = AssetServer(tmp_path, hidden=[tmp_path / "state"])
    assert get(server, "/.edge/admin-token") is None
    assert get(server, "/state/db") is None
    os.symlink(tmp_path / ".edge" / "admin-token", tmp_path / "token.txt")
    assert get(server, "/token.txt") is None  # where a symlink leads counts, not its name
    assert get(server, "/").body == b"hi"
