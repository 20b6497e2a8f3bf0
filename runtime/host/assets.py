"""Static assets (wrangler's `assets`): files under one folder, served before the worker.

A request whose path names a file (after html_handling's rules) gets that file, with its content
type, an ETag and 304 to a matching If-None-Match; anything else goes to the worker, except
navigation requests (Sec-Fetch-Mode: navigate) when not_found_handling is set, which get the SPA's
index.html or the nearest 404.html, as on Workers. `run_worker_first` sends every path (true) or
the matching ones (patterns, `!` to exclude) to the worker first. `env.ASSETS.fetch(...)` asks the
same server, with not_found_handling applied to every miss.

No path leaves the folder: `..` segments are refused, every candidate is resolved (symlinks
followed) and must lie inside the resolved folder. The project's private files (secrets, configs,
our state, git) are never served, since `directory = "."` puts them in the folder.
"""

from __future__ import annotations

import hashlib
import mimetypes
import re
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, urlsplit

from runtime.control.config import CONFIG_NAMES
from runtime.control.dev_vars import FILES as SECRET_FILES

ASSETS_SERVICE = "edge:assets"  # the reserved service name env.<assets.binding>.fetch calls reach
MAX_ASSET_BYTES = 25 * 1024 * 1024  # Cloudflare's limit per asset file
CACHE_CONTROL = "public, max-age=0, must-revalidate"
# Never served, at any depth: secrets (and wrangler's per-environment `.dev.vars.<env>`,
# `.env.<env>`), the config files `edge` finds, our state, git, the ignore list.
PRIVATE = frozenset(n.casefold() for n in (*SECRET_FILES, *CONFIG_NAMES, ".edge", ".git", ".assetsignore"))
PRIVATE_PREFIXES = tuple(f"{n}." for n in SECRET_FILES)
HTML_HANDLING = ("auto-trailing-slash", "force-trailing-slash", "drop-trailing-slash", "none")
NOT_FOUND_HANDLING = ("single-page-application", "404-page", "none")


@dataclass
class AssetResponse:
    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""


@dataclass
class _Intent:
    file: Path | None = None  # serve this file
    redirect: str | None = None  # or send the client here
    status: int = 200


def content_type(path: Path) -> str:
    guessed, _ = mimetypes.guess_type(path.name)
    kind = guessed or "application/octet-stream"
    if kind.startswith("text/") or kind in ("application/javascript", "application/json", "image/svg+xml"):
        kind += "; charset=utf-8"
    return kind


def _pattern(glob: str) -> re.Pattern:
    """A run_worker_first route: `*` matches anything (slashes too), as in wrangler."""
    return re.compile("^" + ".*".join(re.escape(part) for part in glob.split("*")) + "$")


def private(name: str) -> bool:
    """Whether a path segment names a private file, as any disk may open it: case-insensitively, and
    with what Windows drops (trailing dots and spaces, a `:stream` suffix) dropped."""
    name = name.split(":", 1)[0].rstrip(". ").casefold()
    return name in PRIVATE or name.startswith(PRIVATE_PREFIXES)


class AssetServer:
    def __init__(
        self,
        directory: str | Path,
        html_handling: str = "auto-trailing-slash",
        not_found_handling: str = "none",
        run_worker_first: bool | list[str] = False,
        hidden: list[Path] = (),
    ):
        if html_handling not in HTML_HANDLING:
            raise ValueError(
                f"assets.html_handling: {html_handling!r}; use one of {', '.join(HTML_HANDLING)}"
            )
        if not_found_handling not in NOT_FOUND_HANDLING:
            choices = ", ".join(NOT_FOUND_HANDLING)
            raise ValueError(f"assets.not_found_handling: {not_found_handling!r}; use one of {choices}")
        self.root = Path(directory).resolve()
        self.html_handling = html_handling
        self.not_found_handling = not_found_handling
        self.worker_first_all = run_worker_first is True
        rules = run_worker_first if isinstance(run_worker_first, list) else []
        self._first = [_pattern(r) for r in rules if not r.startswith("!")]
        self._not_first = [_pattern(r[1:]) for r in rules if r.startswith("!")]
        self.hidden = [Path(h).resolve() for h in hidden]  # e.g. the runtime's state folder
        self._etags: dict[Path, tuple[int, int, str]] = {}  # file -> (mtime_ns, size, etag)

    # --- which file ----------------------------------------------------------------------------------

    def file(self, path: str) -> Path | None:
        """The file at URL path `path` (decoded) if it is one inside the folder, else None. Every
        lookup (html_handling's, not_found_handling's) comes here, so here the private ones end."""
        parts = [p for p in path.split("/") if p not in ("", ".")]
        if any(p == ".." or "\x00" in p or "\\" in p or private(p) for p in parts):
            return None
        try:
            real = self.root.joinpath(*parts).resolve(strict=True)
        except (OSError, RuntimeError):  # missing, a symlink loop, a name too long
            return None
        if not real.is_relative_to(self.root) or any(real.is_relative_to(h) for h in self.hidden):
            return None  # a symlink (or anything) that leads out of the folder, or into our state
        if any(private(p) for p in real.relative_to(self.root).parts) or not real.is_file():
            return None  # where a symlink inside leads counts, not only the name asked for
        return real

    def _intent(self, path: str) -> _Intent | None:
        """html_handling's rules (Cloudflare's): which file a path serves, or where it redirects."""
        mode = self.html_handling
        if mode == "none":
            found = self.file(path)
            return _Intent(found) if found else None
        if path.endswith("/"):
            index = self.file(path + "index.html")
            if index:
                if mode == "drop-trailing-slash" and path != "/":
                    return _Intent(redirect=path.rstrip("/"))
                return _Intent(index)
            if path != "/" and (page := self.file(path[:-1] + ".html")):
                return _Intent(page) if mode == "force-trailing-slash" else _Intent(redirect=path[:-1])
            return None
        if path.endswith("/index.html") and self.file(path):
            folder = path[: -len("index.html")]
            return _Intent(redirect=(folder.rstrip("/") or "/") if mode == "drop-trailing-slash" else folder)
        if path.endswith(".html") and self.file(path):
            stem = path[: -len(".html")]
            return _Intent(redirect=stem + "/" if mode == "force-trailing-slash" else stem)
        found = self.file(path)
        if found:
            return _Intent(found)
        if page := self.file(path + ".html"):
            return _Intent(redirect=path + "/") if mode == "force-trailing-slash" else _Intent(page)
        if self.file(path + "/index.html"):
            if mode == "drop-trailing-slash":
                return _Intent(self.file(path + "/index.html"))
            return _Intent(redirect=path + "/")
        return None

    def _not_found(self, path: str) -> _Intent | None:
        if self.not_found_handling == "single-page-application":
            index = self.file("/index.html")
            return _Intent(index) if index else None
        if self.not_found_handling == "404-page":
            folder = path.rsplit("/", 1)[0]
            while True:
                page = self.file(folder + "/404.html")
                if page:
                    return _Intent(page, status=404)
                if not folder:
                    return None
                folder = folder.rsplit("/", 1)[0]
        return None

    # --- answering ---------------------------------------------------------------------------------

    def worker_first(self, path: str) -> bool:
        if self.worker_first_all:
            return True
        return any(p.match(path) for p in self._first) and not any(p.match(path) for p in self._not_first)

    def serve(
        self, method: str, path: str, headers: dict[str, str], query: str = "", binding: bool = False
    ) -> AssetResponse | None:
        """The answer for a request to `path` (decoded), or None: the worker's to answer.
        `binding`: the call came through env.ASSETS.fetch (never None then: a miss is a 404)."""
        method = method.upper()
        if method not in ("GET", "HEAD"):
            return AssetResponse(405, [("allow", "GET, HEAD")]) if binding else None
        if not binding and self.worker_first(path):
            return None
        intent = self._intent(path)
        navigation = headers.get("sec-fetch-mode") == "navigate"
        if intent is None and (binding or navigation):
            intent = self._not_found(path)
        if intent is None:
            return (
                AssetResponse(404, [("content-type", "text/plain; charset=utf-8")], b"Not Found")
                if binding
                else None
            )
        if intent.redirect is not None:
            location = intent.redirect + (f"?{query}" if query else "")
            return AssetResponse(307, [("location", location)])
        response = self._file_response(intent.file, intent.status, headers)
        if method == "HEAD" and binding:  # over HTTP the server drops a HEAD's body itself
            response.body = b""
        return response

    def fetch(self, method: str, url: str, headers: dict[str, str]) -> AssetResponse:
        """env.ASSETS.fetch(request_or_url): the host is ignored, the path is the asset's."""
        parts = urlsplit(url)
        return self.serve(method, unquote(parts.path or "/"), headers, parts.query, binding=True)

    def _etag(self, file: Path, data: bytes, stat) -> str:
        cached = self._etags.get(file)
        if cached and cached[:2] == (stat.st_mtime_ns, stat.st_size):
            return cached[2]
        etag = '"' + hashlib.sha256(data).hexdigest()[:32] + '"'
        self._etags[file] = (stat.st_mtime_ns, stat.st_size, etag)
        return etag

    def _file_response(self, file: Path, status: int, headers: dict[str, str]) -> AssetResponse:
        try:
            stat = file.stat()
            if stat.st_size > MAX_ASSET_BYTES:
                return AssetResponse(
                    413, [("content-type", "text/plain; charset=utf-8")], b"asset over the 25 MiB limit"
                )
            data = file.read_bytes()
        except OSError:
            return AssetResponse(404, [("content-type", "text/plain; charset=utf-8")], b"Not Found")
        etag = self._etag(file, data, stat)
        out = [("content-type", content_type(file)), ("etag", etag), ("cache-control", CACHE_CONTROL)]
        if status == 200 and _matches(headers.get("if-none-match"), etag):
            return AssetResponse(304, [("etag", etag), ("cache-control", CACHE_CONTROL)])
        return AssetResponse(status, out, data)


def _matches(if_none_match: str | None, etag: str) -> bool:
    if not if_none_match:
        return False
    tags = [t.strip().removeprefix("W/") for t in if_none_match.split(",")]
    return "*" in tags or etag in tags
