"""The worker's own surroundings as module-level names, as Cloudflare's `workers` has them:
`env` (the bindings), `wait_until(awaitable)` (the current request's ctx.waitUntil) and
`patch_env(...)`; `import_from_javascript("cloudflare:workers")` is workers.javascript's.

The isolate tells this module where the env and the current request's ctx are with `_install`
(as it does for fetch). Until it does, both are learnt from the worker itself: a WorkerEntrypoint
is built with (ctx, env) for each request, and an `@handler` on_fetch receives them.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Awaitable, Callable, Iterator, Sequence
from typing import Any

_env: Any = None
_current_ctx: Callable[[], Any] | None = None
_ctx: contextvars.ContextVar[Any] = contextvars.ContextVar("workers_ctx", default=None)
_patches: contextvars.ContextVar[tuple[dict[str, Any], ...]] = contextvars.ContextVar(
    "workers_env_patches", default=()
)


def _install(*, env: Any = None, current_ctx: Callable[[], Any] | None = None) -> None:
    """Set by the runtime inside an isolate: the worker's env, and a function that returns the
    ctx of the request being handled (None outside one)."""
    global _env, _current_ctx
    if env is not None:
        _env = env
    if current_ctx is not None:
        _current_ctx = current_ctx


def _remember(ctx: Any, env: Any) -> None:
    """An entry point was given (ctx, env) for the request running now."""
    global _env
    if env is not None and _env is None:
        _env = env
    if ctx is not None:
        _ctx.set(ctx)


def current_ctx() -> Any:
    """The ctx of the request this code runs for, or None."""
    ctx = _current_ctx() if _current_ctx is not None else None
    return ctx if ctx is not None else _ctx.get()


def wait_until(awaitable: Awaitable[Any]) -> None:
    """Keep `awaitable` running after the response is sent: the current request's ctx.waitUntil."""
    ctx = current_ctx()
    if ctx is None:
        raise RuntimeError("wait_until works while a worker handles a request in the edge runtime")
    ctx.waitUntil(awaitable)


waitUntil = wait_until  # noqa: N816 - Cloudflare exports both names


class _Env:
    """`from workers import env`: the worker's bindings, looked up when used (so it can be
    imported at the top of a script, before the first request)."""

    def _target(self) -> Any:
        if _env is None:
            raise RuntimeError("workers.env is available once the worker runs in the edge runtime")
        return _env

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        for patch in reversed(_patches.get()):
            if name in patch:
                return patch[name]
        return getattr(self._target(), name)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.__getattr__(name)
        except AttributeError:
            raise KeyError(name) from None

    def __contains__(self, name: str) -> bool:
        return any(name in p for p in _patches.get()) or (_env is not None and name in _env)

    def __repr__(self) -> str:
        return f"workers.env({_env!r})" if _env is not None else "workers.env(<not running>)"


env = _Env()


@contextlib.contextmanager
def patch_env(d: dict[str, Any] | Sequence[tuple[str, Any]] | None = None, **kwds: Any) -> Iterator[None]:
    """Within the block, `workers.env.NAME` reads the values given (for tests and local overrides)."""
    values = dict(d or {}) | kwds
    token = _patches.set((*_patches.get(), values))
    try:
        yield
    finally:
        _patches.reset(token)


def python_to_rpc(value: Any) -> Any:
    """Cloudflare converts Python values for an RPC call to JavaScript. Here both sides are
    Python, so plain data passes as it is (pyodide.ffi proxies become plain data)."""
    return value.to_py() if hasattr(value, "to_py") else value


def python_from_rpc(obj: Any) -> Any:
    """The reverse of python_to_rpc: plain Python data from an RPC result."""
    return obj.to_py() if hasattr(obj, "to_py") else obj
