"""Which worker project a test runs, and its config with the runtime's state moved to the test's own
folder, so that every test starts from empty KV, D1, R2, Vectorize, queues, workflows and objects."""

from __future__ import annotations

from pathlib import Path

from runtime.control.config import CONFIG_NAMES, ConfigError, WorkerConfig, load_config


class TestedConfig(WorkerConfig, kw_only=True):
    """A project's config whose state dir (`.edge/` beside the config under `edge dev`) is a folder
    of the test's own; everything else (main, bindings, [edge], the models) is the project's."""

    __test__ = False  # a class named Test* is no test class (pytest collects by name)

    state_root: str

    @property
    def state_dir(self) -> Path:
        return Path(self.state_root)


def with_state_dir(config: WorkerConfig, state_dir: Path) -> TestedConfig:
    fields = {name: getattr(config, name) for name in config.__struct_fields__ if name != "state_root"}
    return TestedConfig(**fields, state_root=str(state_dir))


def find_project_config(start: Path, stop: Path | None = None) -> Path | None:
    """The first config (wrangler.json, wrangler.jsonc, wrangler.toml, wrangler-like.toml, in
    `edge`'s order) in `start` or a folder above it, up to `stop` (the rootdir) included."""
    folder = start if start.is_dir() else start.parent
    folder = folder.resolve()
    stop = stop.resolve() if stop is not None else None
    while True:
        for name in CONFIG_NAMES:
            if (folder / name).is_file():
                return folder / name
        if folder == stop or folder.parent == folder:
            return None
        folder = folder.parent


def load_project(path: Path) -> WorkerConfig:
    """The project's config as `edge dev --config PATH` reads it; ConfigError says what is wrong."""
    if not path.is_file():
        raise ConfigError(f"{path}: no such config file")
    return load_config(path)
