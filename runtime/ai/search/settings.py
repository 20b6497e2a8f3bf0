"""An instance's settings as Cloudflare's create / update bodies name them, checked once: a key
this edge does not know is refused naming the known ones (as env.AI.run refuses an unknown
option), a known key of the wrong type or range says what to send. Settings that only matter on
Cloudflare's network (caching, public endpoints, tokens, sync intervals) are kept and echoed."""

from __future__ import annotations

import re
from typing import Any

from runtime.ai.search import chunking
from runtime.ai.search.errors import INVALID, SOURCE, AISearchError

NAME = re.compile(r"^[a-z0-9][a-z0-9_-]{0,63}$")
DEFAULT_MODEL = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"
DEFAULT_EMBEDDING = "@cf/baai/bge-m3"
MAX_RESULTS = 50
CUSTOM_FIELDS = 5  # custom metadata fields an item carries (and an instance's schema declares)
DATA_TYPES = ("text", "number", "boolean", "datetime")

DEFAULTS: dict[str, Any] = {
    "type": None,
    "source": None,
    "source_params": None,
    "chunk": True,
    "chunk_size": chunking.DEFAULT_SIZE,
    "chunk_overlap": chunking.DEFAULT_OVERLAP,
    "embedding_model": DEFAULT_EMBEDDING,
    "ai_search_model": DEFAULT_MODEL,
    "rewrite_model": None,
    "rewrite_query": False,
    "reranking": False,
    "reranking_model": "@cf/baai/bge-reranker-base",
    "max_num_results": 10,
    "score_threshold": 0.0,
    "fusion_method": "rrf",
    "hybrid_search_enabled": True,
    "index_method": {"vector": True, "keyword": True},
    "retrieval_options": {"keyword_match_mode": "and"},
    "custom_metadata": [],
    "system_prompt_ai_search": None,
    "system_prompt_rewrite_query": None,
    "paused": False,
}
# kept and echoed, not acted on here (they shape Cloudflare's network, not retrieval)
ECHOED = (
    "ai_gateway_id",
    "cache",
    "cache_threshold",
    "cache_ttl",
    "metadata",
    "public_endpoint_params",
    "sync_interval",
    "token_id",
    "indexing_options",
    "summarization",
    "summarization_model",
    "system_prompt_index_summarization",
)
KNOWN = frozenset(DEFAULTS) | frozenset(ECHOED)


def bad(why: str) -> AISearchError:
    return AISearchError(INVALID, why)


def check_name(value: Any, what: str = "id") -> str:
    if not isinstance(value, str) or not NAME.match(value):
        raise bad(
            f"{what} {str(value)[:80]!r}: 1 to 64 lowercase letters, digits, '-' and '_', "
            "starting with a letter or digit"
        )
    return value


def _bool(body: dict, key: str) -> None:
    if key in body and not isinstance(body[key], bool):
        raise bad(f"{key}: true or false")


def _int(body: dict, key: str, lo: int, hi: int) -> None:
    if key in body:
        v = body[key]
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise bad(f"{key}: an integer from {lo} to {hi}")


def _float(body: dict, key: str, lo: float, hi: float) -> None:
    if key in body:
        v = body[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise bad(f"{key}: a number from {lo:g} to {hi:g}")


def _choice(body: dict, key: str, choices: tuple) -> None:
    if key in body and body[key] not in choices:
        raise bad(f"{key}: one of {', '.join(map(str, choices))}")


def _model(body: dict, key: str) -> None:
    if key in body and body[key] is not None and (not isinstance(body[key], str) or len(body[key]) > 256):
        raise bad(f"{key}: a model name (a string), or null for the default")


def check_settings(body: Any, creating: bool) -> dict[str, Any]:
    """The settings in a create (with `id`) or update body, checked; refuses what cannot be."""
    if not isinstance(body, dict):
        raise bad("the body is a JSON object of the instance's settings")
    body = dict(body)
    body.pop("id", None) if creating else body.pop("name", None)
    if "aisearch_model" in body:  # the SDK's Python name for ai_search_model
        body["ai_search_model"] = body.pop("aisearch_model")
    if "system_prompt_aisearch" in body:
        body["system_prompt_ai_search"] = body.pop("system_prompt_aisearch")
    unknown = sorted(k for k in body if k not in KNOWN)
    if unknown:
        raise bad(
            f"unknown setting {unknown[0][:64]!r}; the settings are: {', '.join(sorted(KNOWN))}"
            + (
                "; a folder source is set in wrangler-like.toml ([[ai_search]] source_dir)"
                if "source_dir" in unknown
                else ""
            )
        )
    kind = body.get("type")
    source = body.get("source")
    if kind == "web-crawler" or (
        kind is None and isinstance(source, str) and re.match(r"^https?://", source)
    ):
        raise AISearchError(
            SOURCE,
            "a web-crawler source cannot be indexed here: this edge reaches no network. Upload the pages "
            "(items.upload), put them in an R2 bucket of the project (type 'r2'), or name a folder in "
            "wrangler-like.toml ([[ai_search]] source_dir)",
        )
    _choice(body, "type", (None, "r2"))
    if kind == "r2" and (not isinstance(source, str) or not source):
        raise bad("source: the R2 bucket's name, for type 'r2'")
    if source is not None and not isinstance(source, str):
        raise bad("source: a string (the R2 bucket's name)")
    if isinstance(source, str) and source and kind is None:
        body["type"] = "r2"  # Cloudflare infers r2 from a bucket's name
    if body.get("source_params") is not None:
        params = body["source_params"]
        if not isinstance(params, dict) or set(params) - {
            "prefix",
            "include_items",
            "exclude_items",
            "r2_jurisdiction",
        }:
            raise bad("source_params: {prefix?, include_items?, exclude_items?} (globs of keys)")
        if "prefix" in params and not isinstance(params["prefix"], str):
            raise bad("source_params.prefix: a string")
        for key in ("include_items", "exclude_items"):
            if key in params and (
                not isinstance(params[key], list) or not all(isinstance(g, str) for g in params[key])
            ):
                raise bad(f"source_params.{key}: a list of glob strings")
    for key in ("chunk", "rewrite_query", "reranking", "hybrid_search_enabled", "paused"):
        _bool(body, key)
    _int(body, "chunk_size", chunking.MIN_SIZE, chunking.MAX_SIZE)
    _int(body, "chunk_overlap", 0, chunking.MAX_OVERLAP)
    _int(body, "max_num_results", 1, MAX_RESULTS)
    _float(body, "score_threshold", 0.0, 1.0)
    _choice(body, "fusion_method", ("rrf", "max"))
    for key in ("embedding_model", "ai_search_model", "rewrite_model", "reranking_model"):
        _model(body, key)
    for key in ("system_prompt_ai_search", "system_prompt_rewrite_query"):
        if body.get(key) is not None and (not isinstance(body[key], str) or len(body[key]) > 16_384):
            raise bad(f"{key}: a string of at most 16384 characters")
    if "index_method" in body:
        m = body["index_method"]
        if (
            not isinstance(m, dict)
            or set(m) - {"vector", "keyword"}
            or not all(isinstance(v, bool) for v in m.values())
        ):
            raise bad("index_method: {vector: bool, keyword: bool}")
    if body.get("retrieval_options") is not None:
        r = body["retrieval_options"]
        if not isinstance(r, dict) or set(r) - {"keyword_match_mode", "boost_by"}:
            raise bad("retrieval_options: {keyword_match_mode?: 'and' | 'or', boost_by?: [...]}")
        _choice(r, "keyword_match_mode", ("and", "or"))
    if "custom_metadata" in body:
        fields = body["custom_metadata"]
        if not isinstance(fields, list) or len(fields) > CUSTOM_FIELDS:
            raise bad(f"custom_metadata: a list of at most {CUSTOM_FIELDS} {{field_name, data_type}}")
        for f in fields:
            if (
                not isinstance(f, dict)
                or not isinstance(f.get("field_name"), str)
                or f.get("data_type") not in DATA_TYPES
            ):
                raise bad(
                    f"custom_metadata: each is {{field_name: str, data_type: {' | '.join(DATA_TYPES)}}}"
                )
    return body


def merged(current: dict[str, Any] | None, changes: dict[str, Any]) -> dict[str, Any]:
    out = dict(DEFAULTS) if current is None else dict(current)
    out.update(changes)
    if out.get("hybrid_search_enabled") is False and "index_method" not in changes:
        out["index_method"] = {"vector": True, "keyword": False}
    return out
