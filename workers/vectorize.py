"""`env.VECTORIZE`: a Vectorize index binding (insert, upsert, query, queryById, getByIds,
deleteByIds, describe), as Cloudflare's Python Workers call it."""

from __future__ import annotations

from array import array
from typing import Any

from workers.binding_values import JsObject, Transport, merge_options, wrap_result

VECTOR_FIELDS = ("id", "values", "metadata", "namespace")
BATCH = 1000  # vectors per insert / upsert, as Cloudflare allows (the runtime checks it too)


def _packed(values: Any, what: str) -> bytes:
    """A vector's values as float32s: a list, a tuple, an array or anything with tolist() (numpy)."""
    if hasattr(values, "tolist") and not isinstance(values, (list, tuple)):
        values = values.tolist()
    if not isinstance(values, (list, tuple, array)):
        raise TypeError(f"{what}: values must be a list of numbers, got {type(values).__name__}")
    try:
        return array("f", values).tobytes()
    except (TypeError, OverflowError):
        raise TypeError(f"{what}: values must be a list of numbers") from None


def _vector(vector: Any, i: int) -> dict[str, Any]:
    if hasattr(vector, "to_py"):
        vector = vector.to_py()
    if not isinstance(vector, dict):
        raise TypeError(f"vectors[{i}] must be a dict {{'id', 'values', 'metadata'?, 'namespace'?}}")
    out = {k: v for k, v in vector.items() if k in VECTOR_FIELDS and v is not None}
    out.update({k: v for k, v in vector.items() if k not in VECTOR_FIELDS})  # the runtime names them
    if "values" in out:
        out["values"] = _packed(out["values"], f"vectors[{i}]")
    return out


class VectorizeIndex:
    """`env.VECTORIZE`: `await env.VECTORIZE.upsert([{"id": "a", "values": [...], "metadata": {...}}])`,
    `await env.VECTORIZE.query(vector, {"topK": 5, "returnMetadata": "all"})` -> `.matches`, each
    with `.id`, `.score` and, when asked, `.values` and `.metadata`."""

    def __init__(self, transport: Transport):
        self._call = transport

    async def _write(self, method: str, vectors: Any) -> JsObject:
        if hasattr(vectors, "to_py"):
            vectors = vectors.to_py()
        if not isinstance(vectors, (list, tuple)):
            raise TypeError(f"{method}: pass a list of vectors")
        if len(vectors) > BATCH:
            raise ValueError(
                f"{method}: {len(vectors)} vectors in one call; at most {BATCH}: split them into batches"
            )
        return wrap_result(await self._call(method, [[_vector(v, i) for i, v in enumerate(vectors)]], {}))

    async def insert(self, vectors: Any) -> JsObject:
        """Add vectors; an id the index holds already keeps its vector (upsert replaces it)."""
        return await self._write("insert", vectors)

    async def upsert(self, vectors: Any) -> JsObject:
        return await self._write("upsert", vectors)

    async def query(self, vector: Any, options: dict[str, Any] | None = None, **kwargs: Any) -> JsObject:
        """`{"count", "matches": [{"id", "score", "values"?, "metadata"?, "namespace"?}]}`, best first;
        options topK (default 5), returnValues, returnMetadata ("none", "indexed", "all"), filter,
        namespace."""
        opts = merge_options(options, kwargs, "Vectorize query")
        return wrap_result(await self._call("query", [_packed(vector, "query")], opts))

    async def queryById(
        self, vector_id: str, options: dict[str, Any] | None = None, **kwargs: Any
    ) -> JsObject:  # noqa: N802
        opts = merge_options(options, kwargs, "Vectorize queryById")
        return wrap_result(await self._call("queryById", [vector_id], opts))

    async def getByIds(self, ids: list[str]) -> list:  # noqa: N802 - Cloudflare's names
        return wrap_result(await self._call("getByIds", [list(ids)], {}))

    async def deleteByIds(self, ids: list[str]) -> JsObject:  # noqa: N802
        return wrap_result(await self._call("deleteByIds", [list(ids)], {}))

    async def describe(self) -> JsObject:
        return wrap_result(await self._call("describe", [], {}))

    query_by_id, get_by_ids, delete_by_ids = queryById, getByIds, deleteByIds
