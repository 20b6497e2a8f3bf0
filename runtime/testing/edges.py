"""What a test session shares between its tests: one event loop, and per project one simulated edge
(its GPU PoPs with their engines: loading the models takes seconds) and its installed dependencies.

Everything a worker can change (KV, D1, R2, Vectorize, queues, workflows, Durable Objects, the
state database) is per test: runtime.testing.worker builds a Runtime over the shared edge with its
state in the test's own folder."""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runtime.control.config import ConfigError, WorkerConfig
from runtime.testing.project import load_project

COMPILE_ENV = "EDGE_COMPILE"  # engine.step.compiled_step reads it when an engine is built


class EdgeStartError(Exception):
    """The project's edge (its models) or isolation cannot start; the message says what to change."""


class SharedEdge:
    """An Edge lent to one test's Runtime: everything passes through, but Runtime.stop's close is
    ignored, since the session closes the edge once, after its last test."""

    def __init__(self, edge: Any):
        object.__setattr__(self, "_edge", edge)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._edge, name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(self._edge, name, value)

    def close(self) -> None:
        """Kept open for the session's next test."""


@dataclass
class Project:
    """One project's session-wide parts: its config as read, its edge and its dependencies."""

    config: WorkerConfig
    edge: Any  # edge_sim.edge.Edge
    catalog: dict
    deps: Path | None


@dataclass
class EdgeSession:
    """The session's loop and the projects its tests ran, each started once."""

    insecure_isolation: bool = False
    compile_steps: bool = False
    projects: dict[str, Project] = field(default_factory=dict)
    _loop: asyncio.AbstractEventLoop | None = None

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The one loop every test of the session runs on (the edge's PoPs answer on the caller's
        loop, and a Runtime's tasks must stay on one)."""
        if self._loop is None or self._loop.is_closed():
            self._loop = asyncio.new_event_loop()
        return self._loop

    def check_isolation(self) -> None:
        from runtime.isolate import process as isolate

        if self.insecure_isolation:
            isolate.use_insecure_isolation()
        elif problem := isolate.isolation_problem():
            raise EdgeStartError(
                f"{problem}\n(pytest --edge-insecure-isolation runs workers without namespaces, as "
                "edge dev --insecure-isolation does; use it only for scripts you trust)"
            )

    def project(self, config_path: Path) -> Project:
        """The project's shared parts, started on first use: its config, its edge (the models load
        here, once per session) and its dependencies (installed once, into the project's own
        .edge/python/ as edge dev does, so both share the install)."""
        key = str(config_path.resolve())
        found = self.projects.get(key)
        if found is not None:
            return found
        try:
            config = load_project(config_path)
        except ConfigError as exc:
            raise EdgeStartError(str(exc)) from None
        self.check_isolation()
        from runtime.ai.catalog import catalog_if_any
        from runtime.cli.servers import build_edge
        from runtime.host.deps import DependencyError, install

        before = os.environ.get(COMPILE_ENV)
        if not self.compile_steps:  # eager steps: a compile per engine would cost each session minutes
            os.environ[COMPILE_ENV] = "0"
        try:
            edge = build_edge(config)
        except ConfigError as exc:
            raise EdgeStartError(f"{config_path}: {exc}") from None
        except Exception as exc:  # a model that fails to load, say: why, not a traceback
            raise EdgeStartError(f"{config_path}: {type(exc).__name__}: {exc}") from exc
        finally:
            if before is None:
                os.environ.pop(COMPILE_ENV, None)
            else:
                os.environ[COMPILE_ENV] = before
        try:
            deps = install(Path(config.base_dir), config.state_dir, log=lambda m: None)
        except (DependencyError, OSError) as exc:
            edge.close()
            raise EdgeStartError(f"{config_path}: {exc}") from None
        project = self.projects[key] = Project(config, edge, catalog_if_any(config), deps)
        return project

    def close(self) -> None:
        for project in self.projects.values():
            project.edge.close()
        self.projects.clear()
        if self._loop is not None and not self._loop.is_closed():
            settle(self._loop)
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.close()


def settle(loop: asyncio.AbstractEventLoop) -> None:
    """Cancel what is left on the loop (a stopped Runtime's watchers) and let it finish, so that no
    task outlives its test."""
    pending = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for task in pending:
        task.cancel()
    if pending:
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
