"""Vectorize's store: insert and query throughput, and the approximate search's recall@10 against
exact search, on random vectors, in the same run.

    python bench/vectorize.py [--n 100000] [--dims 768] [--queries 200] [--metric cosine]

Inserts `n` random vectors (standard normal, float32) through the binding's own store
(runtime.bindings.vectorize.VectorizeStore: checks, SQLite under a temporary state dir, the
in-memory index) in upserts of 500, the batch a worker's 2 MiB frame carries at 768 dimensions;
the HNSW graph (usearch) is built when the index reaches EXACT_BELOW vectors and kept in step after.
Then `queries` random queries at topK 10 through the store (approximate: graph candidates
re-scored exactly) and the same queries by exact search over every vector (the baseline), with
recall@10 = the share of the exact top 10 that the store's answer holds. Random gaussian vectors
in high dimensions are the hard case for a graph index (every point is nearly equidistant);
clustered data such as real embeddings scores higher (tests/unit/test_vectorize.py).
"""

from __future__ import annotations

import argparse
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from runtime.bindings import vector_search  # noqa: E402
from runtime.bindings.vector_search import EXPANSION_SEARCH  # noqa: E402
from runtime.bindings.vectorize import VectorizeStore  # noqa: E402

BATCH = 500
SWEEP = (100, 300, 1000, 2000)  # the graph's breadth per query, each measured on the same graph


def cpu_model() -> str:
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, check=False).stdout
        return next(
            line.split(":", 1)[1].strip() for line in out.splitlines() if line.startswith("Model name")
        )
    except (OSError, StopIteration):
        return platform.processor() or "unknown"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=100_000, help="vectors to insert")
    ap.add_argument("--dims", type=int, default=768)
    ap.add_argument("--queries", type=int, default=200)
    ap.add_argument("--metric", default="cosine", choices=["cosine", "euclidean", "dot-product"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--exact-below",
        type=int,
        default=20_000,
        help="build the graph from this many vectors (the store's own threshold is "
        f"{vector_search.EXACT_BELOW}; lower, so that the graph is measured)",
    )
    args = ap.parse_args()
    vector_search.EXACT_BELOW = args.exact_below
    rng = np.random.default_rng(args.seed)
    data = rng.standard_normal((args.n, args.dims)).astype(np.float32)
    queries = rng.standard_normal((args.queries, args.dims)).astype(np.float32)
    with tempfile.TemporaryDirectory() as tmp:
        store = VectorizeStore(Path(tmp) / "vectorize.sqlite")
        store.create("bench", "bench", args.dims, args.metric)
        started = time.perf_counter()
        for start in range(0, args.n, BATCH):
            batch = [
                {"id": f"v{i}", "values": data[i].tobytes()} for i in range(start, min(start + BATCH, args.n))
            ]
            store.call("bench", "bench", "upsert", [batch], {})
        insert_s = time.perf_counter() - started
        search = store._index("bench", "bench").search
        approximate = search.approximate
        widths_tried = SWEEP if approximate else (None,)
        key_to_row = {int(k): int(k) - 1 for k in search.keys()}  # keys are rowids 1..n in insert order
        exact, exact_ms = [], []
        for q in queries:
            t = time.perf_counter()
            found = search.exact(q, 10)
            exact_ms.append((time.perf_counter() - t) * 1000)
            exact.append([key_to_row[k] for k, _ in found])
        measured = []
        for width in widths_tried:
            if width is not None:
                search._graph.expansion_search = width
            ann, ann_ms = [], []
            for q in queries:
                t = time.perf_counter()
                found = store.call("bench", "bench", "query", [q.tobytes()], {"topK": 10})
                ann_ms.append((time.perf_counter() - t) * 1000)
                ann.append([int(m["id"][1:]) for m in found["matches"]])
            recall = statistics.mean(len(set(a) & set(e)) / 10 for a, e in zip(ann, exact, strict=True))
            measured.append((width, statistics.median(ann_ms), recall))
        store.close()
    exact_p50 = statistics.median(exact_ms)
    print(
        f"vectorize bench: {args.n} random vectors of {args.dims} dimensions, {args.metric}, "
        f"{args.queries} queries at topK 10; CPU {cpu_model()}; graph from {args.exact_below} vectors"
    )
    rows = [
        (
            "insert (upserts of 500, SQLite + index)",
            f"{args.n / insert_s:,.0f} vectors/s",
            f"{insert_s:.1f} s total",
        ),
        (
            "query, exact search (baseline)",
            f"{1000 / exact_p50:,.0f} queries/s",
            f"p50 {exact_p50:.2f} ms, recall 1",
        ),
    ]
    for width, p50, recall in measured:
        how = (
            "exact"
            if width is None
            else f"HNSW expansion_search {width}" + (" (the default)" if width == EXPANSION_SEARCH else "")
        )
        rows.append(
            (
                f"query, store ({how})",
                f"{1000 / p50:,.0f} queries/s ({exact_p50 / p50:.2f}x)",
                f"p50 {p50:.2f} ms, recall@10 {recall:.3f}",
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
