"""AI Search bindings, configured as wrangler writes them:

    [[ai_search_namespaces]]          # env.AI_SEARCH: every instance of one namespace
    binding = "AI_SEARCH"
    namespace = "my-ns"

    [[ai_search]]                     # env.DOCS: one instance of the account's "default" namespace
    binding = "DOCS"
    instance_name = "docs"
    source_dir = "docs/"              # edge only: a folder of the project indexed into that instance

Their calls are not a store's: the worker host (runtime.host.worker_calls) hands them to the AI
Search service through runtime.ai.search.binding, with the worker's account and the generation of
its request. `open` is here only because every kind declares a store; it refuses every call.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec

from runtime.bindings.common import BindingError
from runtime.bindings.kind import BindingKind

NAMESPACE_KIND = "ai_search_namespace"
INSTANCE_KIND = "ai_search"
KINDS = (NAMESPACE_KIND, INSTANCE_KIND)
DEFAULT_NAMESPACE = "default"  # every account has it; an [[ai_search]] binding's instance is in it


class AISearchNamespaceConfig(msgspec.Struct, kw_only=True):
    """An ai_search_namespaces entry of the wrangler config."""

    binding: str
    namespace: str
    remote: bool | None = None  # wrangler's; always local here


class AISearchNamespaceUpload(msgspec.Struct, forbid_unknown_fields=True):
    binding: str
    namespace: str


class AISearchConfig(msgspec.Struct, kw_only=True):
    """An ai_search entry of the wrangler config; `source_dir` (edge's own key) names a folder of
    the project, relative to the config, that `edge dev` indexes into the instance."""

    binding: str
    instance_name: str
    remote: bool | None = None  # wrangler's; always local here
    source_dir: str | None = None


class AISearchUpload(msgspec.Struct, forbid_unknown_fields=True):
    binding: str
    instance_name: str


class NoStore:
    """What BindingStores would open for an AI Search kind: nothing serves calls through it."""

    def call(self, account: str, ident: str, method: str, args: list, kwargs: dict) -> Any:
        raise BindingError(
            "TypeError",
            f"{method}: AI Search bindings are answered by the runtime's AI Search service, "
            "not by a binding store",
        )

    def close(self) -> None:
        pass


def _no_store(state_dir: Path, query_s: float) -> NoStore:
    return NoStore()


NAMESPACE = BindingKind(
    NAMESPACE_KIND, "ai_search_namespaces", AISearchNamespaceConfig, AISearchNamespaceUpload,
    ("namespace",), _no_store, "workers.ai_search:AISearchNamespace",
)  # fmt: skip
INSTANCE = BindingKind(
    INSTANCE_KIND, "ai_search", AISearchConfig, AISearchUpload, ("instance_name",), _no_store,
    "workers.ai_search:AISearchInstance",
)  # fmt: skip


def source_folders(entries: list[Any], base_dir: Path) -> list[tuple[str, Path]]:
    """(instance name, folder) of each [[ai_search]] entry with a `source_dir`, resolved against
    the config's folder (`base_dir`); ValueError naming the entry when the folder is not one."""
    found: list[tuple[str, Path]] = []
    for i, entry in enumerate(entries):
        source = getattr(entry, "source_dir", None)
        if not source:
            continue
        folder = (Path(base_dir) / source).resolve()
        if not folder.is_dir():
            raise ValueError(f"ai_search.{i}.source_dir: {source!r} is not a folder (looked in {folder})")
        found.append((entry.instance_name, folder))
    return found
