"""KV, D1, R2 and queue bindings as a worker sees them: `env.KV`, `env.DB`, `env.BUCKET`, `env.QUEUE`.

The shapes are Cloudflare's (Workers KV, D1 and R2 binding APIs) as its Python Workers expose
them: methods take Cloudflare's argument names, either as keywords (`put(k, v, expirationTtl=60)`)
or as the options dict (`put(k, v, {"expirationTtl": 60})`), and results can be read by attribute
(`result.results`, `result.meta.changes`) or by key (`result["results"]`); `.to_py()` gives plain
dicts and lists, as on a JsProxy.

Each class takes a transport, `async (method, args, kwargs) -> Any`, that carries the call to the
runtime, which holds the data (this package runs inside the isolate and imports nothing of ours).
"""

from __future__ import annotations

from workers.binding_values import BindingError, JsObject, Transport, binding_error
from workers.d1 import D1Database, D1PreparedStatement
from workers.kv import KV_TYPES, KVListResult, KVNamespace
from workers.queue_producer import Queue
from workers.r2 import R2Bucket, R2Object, R2ObjectBody

__all__ = [
    "KV_TYPES",
    "BindingError",
    "D1Database",
    "D1PreparedStatement",
    "JsObject",
    "KVListResult",
    "KVNamespace",
    "Queue",
    "R2Bucket",
    "R2Object",
    "R2ObjectBody",
    "Transport",
    "binding_error",
]
