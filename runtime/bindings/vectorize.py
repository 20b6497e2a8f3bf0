"""Vectorize, simulated: `env.VECTORIZE.insert / upsert / query / queryById / getByIds /
deleteByIds / describe`, over indexes made by `edge vectorize create NAME --dimensions D --metric M`.

Configured as wrangler writes it: `"vectorize": [{"binding": "VECTORIZE", "index_name": "docs"}]`.
Every account's indexes live in one SQLite file (`.edge/vectorize.sqlite`): the index (dimensions,
metric, a version bumped by every change) and each vector (its id, namespace, float32 values and
JSON metadata), so they survive a restart, and another account's index of the same name is another
index. Searching runs in memory (runtime.bindings.vector_search: exact below 200,000 vectors,
usearch's HNSW above), loaded from the file on first use and again whenever the version says that
another process (the CLI) changed it. Changes apply at once (Cloudflare's are asynchronous: a
`mutationId` is returned there and here alike).

Cloudflare's limits hold: at most 1536 dimensions, 1000 vectors per insert or upsert, ids at most
64 bytes, metadata at most 10 KiB of JSON, namespaces at most 64 bytes (50,000 of them per
index), topK at most 100 (20 with returnValues or returnMetadata "all"), filters at most 2048
bytes. Locally an account keeps at most
100 indexes and 1 GiB of vectors and metadata, and metadata nests at most 32 deep (MAX_METADATA_DEPTH).
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import numpy as np

from runtime.bindings.common import (
    REPLY_BYTES,
    BindingError,
    arity,
    check_quota,
    integer,
    open_private_db,
    options,
    text,
)
from runtime.bindings.kind import BindingKind
from runtime.bindings.vector_filter import check_filter, matches, nests_deeper
from runtime.bindings.vector_search import METRICS, VectorSearch

MAX_DIMENSIONS = 1536
BATCH = 1000  # vectors per insert / upsert, ids per getByIds / deleteByIds
ID_BYTES = 64
NAMESPACE_BYTES = 64
MAX_NAMESPACES = 50_000  # per index, as Cloudflare's paid plan
METADATA_BYTES = 10 * 1024
# Objects and arrays inside each other in one vector's metadata, the metadata object itself 1 deep.
# Cloudflare bounds metadata only by its 10 KiB of JSON, which can nest some 5,000 deep ([[[...]]]),
# and what walks a value recursively (json, msgspec, the SDK's wrap_result in the isolate) fails from
# a few hundred levels: once stored, such a vector would break every answer carrying its metadata.
# A local limit, then, well past any real metadata's shape.
MAX_METADATA_DEPTH = 32
TOP_K, TOP_K_WITH_DATA = 100, 20
INDEX_NAME = re.compile(r"^[a-z][a-z0-9-]{0,63}$")
MAX_INDEXES = 100  # per account, here (Cloudflare's free plan)
RETURN_METADATA = ("none", "indexed", "all")
ERROR = "VECTORIZE_ERROR"
log = logging.getLogger("edge.vectorize")

SCHEMA = """
CREATE TABLE IF NOT EXISTS indexes (
    account TEXT NOT NULL, name TEXT NOT NULL, dimensions INTEGER NOT NULL, metric TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '', created REAL NOT NULL, version INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (account, name));
CREATE TABLE IF NOT EXISTS vectors (
    key INTEGER PRIMARY KEY, account TEXT NOT NULL, index_name TEXT NOT NULL, id TEXT NOT NULL,
    namespace TEXT, vals BLOB NOT NULL, metadata TEXT, UNIQUE (account, index_name, id));
"""


@dataclass
class Loaded:
    """One index in memory: its search structure and, by key, each vector's id, namespace and metadata."""

    version: int
    created: float
    search: VectorSearch
    ids: dict[int, str] = field(default_factory=dict)
    by_id: dict[str, int] = field(default_factory=dict)
    namespaces: dict[int, str | None] = field(default_factory=dict)
    metadata: dict[int, Any] = field(default_factory=dict)


def check_index_name(name: Any) -> str:
    if not isinstance(name, str) or not INDEX_NAME.match(name):
        raise BindingError(
            "TypeError",
            f"index name {name!r}: use 1 to 64 lowercase letters, digits and dashes, starting with a letter",
        )
    return name


class VectorizeStore:
    def __init__(self, path: Path):
        self._db = open_private_db(path)
        self._db.executescript(SCHEMA)
        self._lock = threading.RLock()  # the file's connection: held only around its SQL
        self._loaded: dict[tuple[str, str], Loaded] = {}
        # one lock per index: a long search or load in one index (one account's) never holds another's
        self._index_locks: dict[tuple[str, str], threading.Lock] = {}

    # --- the indexes (edge vectorize create / list / delete / info) ---------------------------

    def create(self, account: str, name: str, dimensions: int, metric: str, description: str = "") -> dict:
        check_index_name(name)
        integer("dimensions", dimensions, 1, MAX_DIMENSIONS)
        if metric not in METRICS:
            raise BindingError("TypeError", f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
        with self._lock:
            (count,) = self._db.execute(
                "SELECT count(*) FROM indexes WHERE account = ?", (account,)
            ).fetchone()
            if count >= MAX_INDEXES:
                raise BindingError(
                    "RangeError", f"this account has {count} indexes, the most here; delete one first"
                )
            try:
                self._db.execute(
                    "INSERT INTO indexes (account, name, dimensions, metric, description, created)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (account, name, dimensions, metric, description, time.time()),
                )
            except Exception as exc:
                if "UNIQUE" not in str(exc):
                    raise
                raise BindingError(ERROR, f"an index named {name!r} exists already in this account") from None
        return self.info(account, name)

    def indexes(self, account: str) -> list[dict]:
        with self._lock:
            names = [
                r[0]
                for r in self._db.execute(
                    "SELECT name FROM indexes WHERE account = ? ORDER BY name", (account,)
                )
            ]
        return [self.info(account, n) for n in names]

    def info(self, account: str, name: str) -> dict:
        row = self._row(account, name)
        with self._lock:
            (count,) = self._db.execute(
                "SELECT count(*) FROM vectors WHERE account = ? AND index_name = ?", (account, name)
            ).fetchone()
        dims, metric, description, created, _ = row
        return {
            "name": name,
            "description": description,
            "config": {"dimensions": dims, "metric": metric},
            "created_on": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(created)),
            "vectorCount": count,
        }

    def delete(self, account: str, name: str) -> None:
        self._row(account, name)
        with self._index_lock(account, name), self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM vectors WHERE account = ? AND index_name = ?", (account, name))
            self._db.execute("DELETE FROM indexes WHERE account = ? AND name = ?", (account, name))
            self._db.execute("COMMIT")
            self._loaded.pop((account, name), None)

    def _row(self, account: str, name: str) -> tuple:
        with self._lock:
            row = self._db.execute(
                "SELECT dimensions, metric, description, created, version FROM indexes"
                " WHERE account = ? AND name = ?",
                (account, name),
            ).fetchone()
        if row is None:
            raise BindingError(
                ERROR,
                f"no Vectorize index {name!r} in this account; create it with "
                f"`edge vectorize create {name} --dimensions D --metric cosine` "
                "(D: your embedding model's width)",
            )
        return row

    def _index(self, account: str, name: str) -> Loaded:
        """The index in memory, (re)loaded when its version in the file moved on."""
        dims, metric, _, created, version = self._row(account, name)
        loaded = self._loaded.get((account, name))
        if loaded is not None and loaded.version == version and loaded.created == created:
            return loaded
        loaded = Loaded(version, created, VectorSearch(dims, metric))
        with self._lock:
            rows = self._db.execute(
                "SELECT key, id, namespace, vals, metadata FROM vectors WHERE account = ? AND index_name = ?",
                (account, name),
            ).fetchall()
        if rows:
            keys = [r[0] for r in rows]
            loaded.search.add(keys, np.frombuffer(b"".join(r[3] for r in rows), dtype=np.float32))
            for key, ident, namespace, _, metadata in rows:
                loaded.ids[key], loaded.by_id[ident] = ident, key
                loaded.namespaces[key] = namespace
                loaded.metadata[key] = _stored_metadata(metadata, account, name, ident)
        self._loaded[(account, name)] = loaded
        return loaded

    # --- the binding -------------------------------------------------------------------------

    def call(self, account: str, ident: str, method: str, args: list, kwargs: dict) -> Any:
        handler = {
            "insert": self._insert,
            "upsert": self._upsert,
            "query": self._query,
            "queryById": self._query_by_id,
            "getByIds": self._get_by_ids,
            "deleteByIds": self._delete_by_ids,
            "describe": self._describe,
        }.get(method)
        if handler is None:
            raise BindingError("TypeError", f"a Vectorize index has no method {method!r}")
        with self._index_lock(account, ident):
            return handler(account, ident, args, kwargs)

    def _index_lock(self, account: str, name: str) -> threading.Lock:
        with self._lock:
            return self._index_locks.setdefault((account, name), threading.Lock())

    def _describe(self, account: str, name: str, args: list, kwargs: dict) -> dict:
        arity("describe", args, 0)
        info = self.info(account, name)
        return {
            **info["config"],
            "vectorCount": info["vectorCount"],
            "processedUpToDatetime": info["created_on"],
            "processedUpToMutation": str(self._row(account, name)[4]),
        }

    def _insert(self, account: str, name: str, args: list, kwargs: dict) -> dict:
        return self._write(account, name, args, kwargs, "insert")

    def _upsert(self, account: str, name: str, args: list, kwargs: dict) -> dict:
        return self._write(account, name, args, kwargs, "upsert")

    def _vectors(
        self, what: str, given: Any, dims: int, metric: str
    ) -> list[tuple[str, str | None, bytes, str | None]]:
        if not isinstance(given, list) or not given:
            raise BindingError(
                "TypeError", f"{what}: pass a list of vectors, each {{'id', 'values', 'metadata'?}}"
            )
        if len(given) > BATCH:
            raise BindingError(
                "RangeError",
                f"{what}: {len(given)} vectors in one call; at most {BATCH}: split them into batches",
            )
        out, seen = [], set()
        for i, vector in enumerate(given):
            where = f"{what}: vectors[{i}]"
            if not isinstance(vector, dict):
                raise BindingError("TypeError", f"{where} must be an object {{'id', 'values', 'metadata'?}}")
            unknown = sorted(str(k) for k in vector if k not in ("id", "values", "metadata", "namespace"))
            if unknown:
                raise BindingError("TypeError", f"{where}: unknown field(s) {', '.join(unknown)}")
            ident = text(f"{where}.id", vector.get("id"), ID_BYTES)
            if ident in seen:
                raise BindingError("TypeError", f"{where}.id {ident!r} appears twice in this call")
            seen.add(ident)
            namespace = vector.get("namespace")
            if namespace is not None:
                text(f"{where}.namespace", namespace, NAMESPACE_BYTES)
            values = self._values(f"{where}.values", vector.get("values"), dims, metric)
            metadata = vector.get("metadata")
            meta = None
            if metadata is not None:
                if not isinstance(metadata, dict):
                    raise BindingError("TypeError", f"{where}.metadata must be an object")
                if nests_deeper(metadata, MAX_METADATA_DEPTH):  # before json.dumps, which recurses
                    raise BindingError(
                        "RangeError",
                        f"{where}.metadata nests objects and arrays more than {MAX_METADATA_DEPTH} deep; "
                        f"the limit is {MAX_METADATA_DEPTH}: flatten it (or keep the deep part as a JSON "
                        "string, or elsewhere, KV or R2, with its key in the metadata)",
                    )
                try:
                    meta = json.dumps(metadata, ensure_ascii=False, allow_nan=False)
                except (TypeError, ValueError):
                    raise BindingError("TypeError", f"{where}.metadata must be JSON") from None
                if len(meta.encode()) > METADATA_BYTES:
                    raise BindingError(
                        "RangeError",
                        f"{where}.metadata is {len(meta.encode())} bytes of JSON; "
                        f"the limit is {METADATA_BYTES} "
                        "(keep large text elsewhere, KV or R2, and its key in the metadata)",
                    )
            out.append((ident, namespace, values.tobytes(), meta))
        return out

    @staticmethod
    def _values(what: str, given: Any, dims: int, metric: str) -> np.ndarray:
        if isinstance(given, bytes):  # the SDK sends float32s packed
            if len(given) % 4:
                raise BindingError("TypeError", f"{what}: packed values must be float32s")
            values = np.frombuffer(given, dtype=np.float32)
        elif isinstance(given, list) and all(
            isinstance(v, (int, float)) and not isinstance(v, bool) for v in given
        ):
            values = np.asarray(given, dtype=np.float32)
        else:
            raise BindingError("TypeError", f"{what} must be a list of numbers")
        if len(values) != dims:
            raise BindingError(
                "TypeError",
                f"{what} has {len(values)} dimensions; this index takes {dims}: embed with a model of "
                f"width {dims}, or create an index of {len(values)} dimensions",
            )
        if not np.isfinite(values).all():
            raise BindingError("TypeError", f"{what} holds NaN or infinity")
        if metric == "cosine" and not values.any():
            raise BindingError("TypeError", f"{what} is all zeros: a cosine index needs a direction")
        return values

    def _write(self, account: str, name: str, args: list, kwargs: dict, mode: str) -> dict:
        arity(mode, args, 1)
        options(mode, kwargs, set())
        dims, metric, *_ = self._row(account, name)
        vectors = self._vectors(mode, args[0], dims, metric)
        loaded = self._index(account, name)
        if mode == "insert":  # insert keeps an id that exists; upsert replaces it
            vectors = [v for v in vectors if v[0] not in loaded.by_id]
        held = set(loaded.namespaces.values()) - {None}
        new = {v[1] for v in vectors} - held - {None}
        if len(held) + len(new) > MAX_NAMESPACES:
            raise BindingError(
                "RangeError",
                f"{mode}: this index would hold {len(held) + len(new)} namespaces; at most {MAX_NAMESPACES}: "
                "reuse namespaces, or filter on metadata instead",
            )
        adding = sum(len(v[2]) + len((v[3] or "").encode()) for v in vectors)
        replaced = [loaded.by_id[v[0]] for v in vectors if v[0] in loaded.by_id]
        with self._lock:
            keys = self._store(account, name, vectors, adding)
        self._forget(loaded, replaced)
        if keys:
            loaded.search.add(keys, np.frombuffer(b"".join(v[2] for v in vectors), dtype=np.float32))
        for key, (ident, namespace, _, meta) in zip(keys, vectors, strict=True):
            loaded.ids[key], loaded.by_id[ident] = ident, key
            loaded.namespaces[key] = namespace
            loaded.metadata[key] = json.loads(meta) if meta is not None else None
        loaded.version += 1
        ids = [v[0] for v in vectors]
        return {"mutationId": str(uuid.uuid4()), "count": len(ids), "ids": ids}

    def _store(self, account: str, name: str, vectors: list, adding: int) -> list[int]:
        """The vectors written in one transaction (under the connection's lock); their keys."""
        self._db.execute("BEGIN IMMEDIATE")
        try:
            (used,) = self._db.execute(
                "SELECT COALESCE(SUM(LENGTH(vals) + COALESCE(LENGTH(metadata), 0)), 0) FROM vectors "
                "WHERE account = ?",
                (account,),
            ).fetchone()
            check_quota("Vectorize", used, adding)
            keys = []
            for ident, namespace, vals, meta in vectors:
                self._db.execute(
                    "DELETE FROM vectors WHERE account = ? AND index_name = ? AND id = ?",
                    (account, name, ident),
                )
                cur = self._db.execute(
                    "INSERT INTO vectors (account, index_name, id, namespace, vals, metadata)"
                    " VALUES (?, ?, ?, ?, ?, ?)",
                    (account, name, ident, namespace, vals, meta),
                )
                keys.append(cur.lastrowid)
            self._db.execute(
                "UPDATE indexes SET version = version + 1 WHERE account = ? AND name = ?", (account, name)
            )
            self._db.execute("COMMIT")
        except BaseException:
            if self._db.in_transaction:
                self._db.execute("ROLLBACK")
            self._loaded.pop((account, name), None)  # reload from the file next time
            raise
        return keys

    @staticmethod
    def _forget(loaded: Loaded, keys: list[int]) -> None:
        loaded.search.remove(keys)
        for key in keys:
            ident = loaded.ids.pop(key)
            loaded.by_id.pop(ident, None)
            loaded.namespaces.pop(key, None)
            loaded.metadata.pop(key, None)

    def _query(self, account: str, name: str, args: list, kwargs: dict) -> dict:
        if len(args) not in (1, 2):
            raise BindingError("TypeError", "query: pass the vector, then an options object")
        given = {**(args[1] if len(args) == 2 and isinstance(args[1], dict) else {}), **kwargs}
        dims, metric, *_ = self._row(account, name)
        vector = self._values("query: the vector", args[0], dims, metric)
        return self._search(account, name, vector, given)

    def _query_by_id(self, account: str, name: str, args: list, kwargs: dict) -> dict:
        if len(args) not in (1, 2):
            raise BindingError("TypeError", "queryById: pass the vector's id, then an options object")
        given = {**(args[1] if len(args) == 2 and isinstance(args[1], dict) else {}), **kwargs}
        ident = text("queryById: id", args[0], ID_BYTES)
        loaded = self._index(account, name)
        key = loaded.by_id.get(ident)
        if key is None:
            return {"count": 0, "matches": []}
        return self._search(account, name, loaded.search.vector(key).copy(), given)

    def _search(self, account: str, name: str, vector: np.ndarray, given: dict) -> dict:
        opts = options("query", given, {"topK", "returnValues", "returnMetadata", "filter", "namespace"})
        return_values = opts.get("returnValues", False)
        if not isinstance(return_values, bool):
            raise BindingError("TypeError", "query: returnValues must be true or false")
        meta_mode = opts.get("returnMetadata", "none")
        if isinstance(meta_mode, bool):  # Vectorize V1's form
            meta_mode = "all" if meta_mode else "none"
        if meta_mode not in RETURN_METADATA:
            raise BindingError(
                "TypeError", f"query: returnMetadata must be one of {', '.join(RETURN_METADATA)}"
            )
        cap = TOP_K_WITH_DATA if return_values or meta_mode == "all" else TOP_K
        top_k = opts.get("topK", 5)
        if isinstance(top_k, int) and not isinstance(top_k, bool) and top_k > cap:
            why = " with returnValues or returnMetadata 'all'" if cap == TOP_K_WITH_DATA else ""
            raise BindingError(
                "RangeError", f"query: topK is {top_k}; at most {cap}{why}: ask for fewer matches"
            )
        top_k = integer("query: topK", top_k, 1, cap)
        checked = check_filter("query", opts["filter"]) if "filter" in opts else None
        namespace = opts.get("namespace")
        if namespace is not None:
            text("query: namespace", namespace, NAMESPACE_BYTES)
        loaded = self._index(account, name)
        allowed = None
        if checked is not None or namespace is not None:
            allowed = [
                key
                for key in loaded.ids
                if (namespace is None or loaded.namespaces[key] == namespace)
                and (checked is None or matches(loaded.metadata[key], checked))
            ]
        found = loaded.search.search(vector, top_k, allowed)
        out = []
        for key, score in found:
            match: dict[str, Any] = {"id": loaded.ids[key], "score": score}
            if return_values:
                match["values"] = self._stored_values(key)
            if meta_mode != "none":
                match["metadata"] = loaded.metadata[key]
            if loaded.namespaces[key] is not None:
                match["namespace"] = loaded.namespaces[key]
            out.append(match)
        return {"count": len(out), "matches": out}

    def _stored_values(self, key: int) -> list[float]:
        with self._lock:
            (vals,) = self._db.execute("SELECT vals FROM vectors WHERE key = ?", (key,)).fetchone()
        return np.frombuffer(vals, dtype=np.float32).tolist()

    def _ids(self, what: str, args: list) -> list[str]:
        arity(what, args, 1)
        ids = args[0]
        if not isinstance(ids, list):
            raise BindingError("TypeError", f"{what}: pass a list of ids")
        if len(ids) > BATCH:
            raise BindingError("RangeError", f"{what}: {len(ids)} ids; at most {BATCH} in one call")
        return [text(f"{what}: ids[{i}]", v, ID_BYTES) for i, v in enumerate(ids)]

    def _get_by_ids(self, account: str, name: str, args: list, kwargs: dict) -> list[dict]:
        ids = self._ids("getByIds", args)
        options("getByIds", kwargs, set())
        loaded = self._index(account, name)
        out, size = [], 0
        for ident in ids:
            key = loaded.by_id.get(ident)
            if key is None:
                continue
            # each value crosses as a 9-byte float; the reply must fit one frame to the isolate
            size += 9 * loaded.search.dimensions + len(json.dumps(loaded.metadata[key])) + 128
            if size > REPLY_BYTES:
                raise BindingError(
                    "RangeError",
                    f"getByIds: the {len(ids)} vectors asked for are over the {REPLY_BYTES // 2**20} MiB one "
                    f"answer carries; ask for at most {len(out)} at a time",
                )
            vector: dict[str, Any] = {"id": ident, "values": self._stored_values(key)}
            if loaded.metadata[key] is not None:
                vector["metadata"] = loaded.metadata[key]
            if loaded.namespaces[key] is not None:
                vector["namespace"] = loaded.namespaces[key]
            out.append(vector)
        return out

    def _delete_by_ids(self, account: str, name: str, args: list, kwargs: dict) -> dict:
        ids = self._ids("deleteByIds", args)
        options("deleteByIds", kwargs, set())
        loaded = self._index(account, name)
        gone = [i for i in dict.fromkeys(ids) if i in loaded.by_id]
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(
                "DELETE FROM vectors WHERE account = ? AND index_name = ? AND id = ?",
                [(account, name, i) for i in gone],
            )
            self._db.execute(
                "UPDATE indexes SET version = version + 1 WHERE account = ? AND name = ?", (account, name)
            )
            self._db.execute("COMMIT")
        self._forget(loaded, [loaded.by_id[i] for i in gone])
        loaded.version += 1
        return {"mutationId": str(uuid.uuid4()), "count": len(gone), "ids": gone}

    def close(self) -> None:
        self._db.close()


def _stored_metadata(stored: str | None, account: str, name: str, ident: str) -> Any:
    """A vector's metadata as read from the file. Metadata an older version stored nesting past
    MAX_METADATA_DEPTH keeps its first MAX_METADATA_DEPTH levels, each object or array below them
    turned into its JSON text (a string), so that the vector stays readable and its data whole;
    metadata that is not JSON at all (a damaged file) reads as none. Either is logged as the index loads."""
    if stored is None:
        return None
    try:
        value = json.loads(stored)
        # fewer brackets than levels cannot nest too deep: most metadata is not walked
        shallow = stored.count("{") + stored.count("[") <= MAX_METADATA_DEPTH
        if shallow or not nests_deeper(value, MAX_METADATA_DEPTH):
            return value
    except (RecursionError, ValueError):
        pass
    try:
        value = json.loads(_flatten_below(stored, MAX_METADATA_DEPTH))
    except (RecursionError, ValueError):
        log.warning(
            "vectorize %s/%s: vector %r: its stored metadata is not JSON; read as none", account, name, ident
        )
        return None
    log.warning(
        "vectorize %s/%s: vector %r: its stored metadata nests more than %d deep; the levels below are "
        "read as JSON text (upsert it flatter to fix it)",
        account, name, ident, MAX_METADATA_DEPTH,
    )  # fmt: skip
    return value


def _flatten_below(text: str, limit: int) -> str:
    """JSON `text` with each object or array nested deeper than `limit` replaced by a JSON string of
    its text: a scan over the characters (strings and their escapes skipped), no recursion."""
    out, depth, start, done, i = [], 0, -1, 0, 0
    while i < len(text):
        c = text[i]
        if c == '"':
            i += 1
            while i < len(text) and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c in "{[":
            depth += 1
            if depth == limit + 1:
                start = i
        elif c in "}]":
            if depth == limit + 1 and start >= 0:
                out += [text[done:start], json.dumps(text[start : i + 1], ensure_ascii=False)]
                done, start = i + 1, -1
            depth -= 1
        i += 1
    out.append(text[done:])
    return "".join(out)


class VectorizeConfig(msgspec.Struct, kw_only=True):
    """A vectorize entry of the wrangler config."""

    binding: str
    index_name: str
    remote: bool | None = None  # wrangler's; always local here


class VectorizeUpload(msgspec.Struct, forbid_unknown_fields=True):
    binding: str
    index_name: str


def store_path(state_dir: Path) -> Path:
    return state_dir / "vectorize.sqlite"


KIND = BindingKind(
    "vectorize", "vectorize", VectorizeConfig, VectorizeUpload, ("index_name",),
    lambda state_dir, query_s: VectorizeStore(store_path(state_dir)), "workers.vectorize:VectorizeIndex",
)  # fmt: skip
