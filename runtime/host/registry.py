"""Which running worker serves a request: the worker `edge dev` serves from the working tree, and
every deployed version, started on first use; the deployment's version split picks among them,
sticky by Cloudflare-Workers-Version-Key."""

from __future__ import annotations

import hashlib
import logging
import random
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import msgspec
from starlette.requests import Request

from runtime.bindings import kinds
from runtime.bindings.kind import field
from runtime.control.config import WorkerConfig
from runtime.control.dev_vars import read_dev_vars
from runtime.control.limits import validate as validate_limits
from runtime.control.state import State, materialise_bundle
from runtime.host.assets import ASSETS_SERVICE
from runtime.host.objects import DurableObjects
from runtime.host.spec import DurableObjectRef, WorkerSpec
from runtime.host.worker import WorkerHandle
from runtime.isolate.types import WorkerLoadError
from runtime.isolate.view import BUNDLE

log = logging.getLogger("edge.runtime")

VERSION_KEY_HEADER = "cloudflare-workers-version-key"


def binding_fields(tables: Mapping[str, Iterable[Any]], objects: Iterable[Any]) -> dict[str, Any]:
    """A WorkerSpec's bindings and Durable Object namespaces, from each binding kind's entries by
    config key and the durable_objects.bindings entries: config structs (the dev worker) or the
    dicts a deployed version stores, by the same loop."""
    return {
        "bindings": kinds.binding_refs(tables),
        "durable_objects": {
            field(b, "name"): DurableObjectRef(field(b, "class_name"), field(b, "script_name"))
            for b in objects
        },
    }


def dev_spec(config: WorkerConfig, deps: Path | None) -> WorkerSpec:
    """The worker `edge dev` serves, as its config describes it now (and its .dev.vars)."""
    c = config
    limits = validate_limits(msgspec.structs.asdict(c.limits), "limits")  # as load_config did
    bound = binding_fields(c.bindings, c.durable_objects.bindings)
    services = {s.binding: s.service for s in c.services}
    services |= {c.assets.binding: ASSETS_SERVICE} if c.assets and c.assets.binding else {}
    return WorkerSpec(
        account=c.account_id,
        name=c.name,
        version=None,
        script=str(c.main_path),
        vars=dict(c.vars),
        ai_binding=c.ai.binding if c.ai else None,
        services=services,
        limits=limits.isolate(),
        subrequests=limits.subrequests,
        **bound,
        deps=str(deps) if deps else None,
        local_secrets=_local_secrets(c, {*bound["bindings"], *bound["durable_objects"], *services}),
    )


def _local_secrets(config: WorkerConfig, bindings: set[str]) -> dict[str, str]:
    """The dev worker's .dev.vars (or .env) beside its config, less the names a binding holds."""
    path, found = read_dev_vars(Path(config.base_dir))
    taken = sorted((bindings | ({config.ai.binding} if config.ai else set())).intersection(found))
    if taken:
        log.warning("%s: %s also name a binding; the binding is what env holds", path, ", ".join(taken))
    if path is not None:
        log.info("%s: %d local secret(s) for %s", path, len(found) - len(taken), config.name)
    return {k: v for k, v in found.items() if k not in taken}


def load_failure(exc: WorkerLoadError, script: Path) -> str:
    """The terminal's account of a script that did not load: the error, then the traceback from the
    first frame of the worker's own files (not the loader's), with the jail's path of its folder
    (/bundle) given back as the folder the user edits, so an editor or a click finds the line."""
    lines = exc.traceback.splitlines()
    ours = (f'  File "{BUNDLE}/', f'  File "{script.parent}/')
    first = next((i for i, line in enumerate(lines) if line.startswith(ours)), None)
    if first is None:
        return str(exc)
    where = "\n".join(lines[first:]).replace(f'File "{BUNDLE}/', f'File "{script.parent}/')
    return f"{exc}\n{where}"


def pick_version(strategy: list[tuple[str, int]], key: str | None) -> str:
    """The version of a split (version, percentage) that a request lands on: the same key always
    lands in the same bucket; without one, a random bucket."""
    bucket = (int(hashlib.sha256(key.encode()).hexdigest(), 16) % 100) if key else random.randrange(100)
    for version, percentage in strategy:
        if bucket < percentage:
            return version
        bucket -= percentage
    return strategy[-1][0]


class WorkerRegistry:
    def __init__(
        self,
        config: WorkerConfig,
        state: State,
        start: Callable[[WorkerSpec], WorkerHandle],
        objects: DurableObjects,
        deps: Path | None = None,
    ):
        self.config, self.state, self.start, self.objects = config, state, start, objects
        self.deps = deps  # the dev worker's installed dependencies (runtime.host.deps), if it lists any
        self.dev = start(dev_spec(config, deps))
        self._deployed: dict[tuple[str, str, str], WorkerHandle] = {}
        self._dev_failure: str | None = None  # why the dev worker's script last failed to load

    def worker(self, account: str, name: str, request: Request | None = None) -> WorkerHandle | None:
        """The handle that serves `name` of `account` (a request picks its version of the split;
        without one, the split's first), or None when no such worker is deployed."""
        active = self.state.active(account, name)
        if account == self.config.account_id and name == self.config.name and not active:
            return self.dev
        if not active:
            return None
        if request is None:
            return self.handle_for(account, name, active[0][0])
        return self.handle_for(account, name, pick_version(active, request.headers.get(VERSION_KEY_HEADER)))

    def handle_for(self, account: str, worker: str, version: str) -> WorkerHandle:
        key = (account, worker, version)
        if key not in self._deployed:
            self._deployed[key] = self.start(self._version_spec(account, worker, version))
        return self._deployed[key]

    def _version_spec(self, account: str, worker: str, version: str) -> WorkerSpec:
        record = self.state.version(account, worker, version)
        if record is None:
            raise LookupError(f"no version {version} of worker {worker!r} in account {account!r}")
        cfg = record["config"]
        try:  # the same check the deploy API made; a version stored before it was made fails here
            limits = validate_limits(cfg, "config")
        except ValueError as exc:
            raise ValueError(f"version {version} of worker {worker!r}: {exc}; deploy it again") from None
        folder = materialise_bundle(self.config.state_dir, version, record["files"])
        return WorkerSpec(
            account=account,
            name=worker,
            version=version,
            script=str(folder / record["main"]),
            vars=cfg.get("vars", {}),
            ai_binding=cfg.get("ai_binding"),
            services=cfg.get("services", {}),
            limits=limits.isolate(),
            subrequests=limits.subrequests,
            **binding_fields(kinds.tables_of(cfg), kinds.at(cfg, "durable_objects.bindings") or []),
        )

    async def restart_worker(self, account: str, name: str) -> None:
        """Its env changed (a secret): stop its isolates; the next request starts fresh ones."""
        if (account, name) == (self.config.account_id, self.config.name):
            await self.reload_dev()
        for key in [k for k in self._deployed if k[:2] == (account, name)]:
            await self._deployed.pop(key).stop()

    async def reload_dev(self) -> None:
        """The dev worker's source changed: the next request starts a fresh isolate on it."""
        old, self.dev = self.dev, self.start(dev_spec(self.config, self.deps))
        await old.stop()
        await self.objects.stop_worker(self.config.account_id, self.config.name)
        log.info("reloaded %s", self.config.name)

    async def source_changed(self) -> None:
        """edge dev --reload saw a save: reload the dev worker and load it at once, so that a save
        that breaks it is reported in the terminal when it is made (as wrangler dev reports a
        build error), not by the next request's bare 503."""
        await self.reload_dev()
        await self.load_dev()

    async def load_dev(self) -> None:
        """Start the dev worker's isolate now. A script that does not load is reported once (file,
        line, error), and serves 503s naming the error meanwhile; the first load after a failure
        says it loads again."""
        main = self.config.main_path
        try:
            await self.dev.isolate.ensure_started()
        except WorkerLoadError as exc:
            failure = load_failure(exc, main)
            if failure != self._dev_failure:
                log.error("%s", failure)  # requests get a 503 naming it meanwhile
            self._dev_failure = failure
        except Exception as exc:  # keep serving: requests get a 503 naming the error until it is fixed
            log.error("%s\n%s", exc, getattr(exc, "traceback", ""))
        else:
            if self._dev_failure is not None:  # a warning: shown wherever the error was
                log.warning("%s loads again: %s is served", main.name, self.config.name)
            self._dev_failure = None

    async def stop(self) -> None:
        await self.dev.stop()
        for handle in self._deployed.values():
            await handle.stop()
