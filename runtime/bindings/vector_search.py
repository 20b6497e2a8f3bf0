"""Nearest-neighbour search over one Vectorize index's vectors, in memory: exact below a size,
approximate (usearch's HNSW graph) above it, with exact scores either way.

Every vector is kept in one float32 matrix (cosine indexes keep unit vectors, so cosine is a dot
product). Below EXACT_BELOW vectors a query scores all of them with one matrix product: exact, and
at that size faster than walking a graph (measured: EXACT_BELOW's comment). From EXACT_BELOW on, a
usearch HNSW index (built once, then kept in step with every add and remove) proposes
max(4 * k, 64) candidates, which are scored
exactly from the matrix; recall against exact search is measured by bench/vectorize.py and the unit
tests. A query restricted to some vectors (a namespace or a metadata filter: `allowed`) is scored
exactly over those, as Cloudflare applies a filter before taking the top k.

Scores are Cloudflare's: cosine similarity and dot product (higher is closer), euclidean distance
(lower is closer).
"""

from __future__ import annotations

import numpy as np

METRICS = ("cosine", "euclidean", "dot-product")
# vectors; above it the HNSW graph proposes candidates. bench/vectorize.py on 100,000 random
# 768-d vectors (2 shared cores): exact 15 ms a query; the graph at breadth 1,000 9 ms with
# recall@10 0.43, at 2,000 19 ms with 0.64. Exact wins at that size, so it serves up to 200,000
# (about 30 ms a query); the graph serves the largest indexes an account can hold here (1 GiB).
EXACT_BELOW = 200_000
CANDIDATES_PER_RESULT, MIN_CANDIDATES = 4, 64
EXPANSION_SEARCH = 1000  # graph breadth per query: recall@10 0.82 on 25k random 768-d vectors, 0.43 on 100k
_USEARCH_METRIC = {"cosine": "ip", "dot-product": "ip", "euclidean": "l2sq"}


def unit(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / np.where(norms == 0, 1, norms)


class VectorSearch:
    """The vectors of one index by integer key (the store's row id)."""

    def __init__(self, dimensions: int, metric: str, exact_below: int | None = None):
        if metric not in METRICS:
            raise ValueError(f"metric must be one of {', '.join(METRICS)}, got {metric!r}")
        self.dimensions, self.metric = dimensions, metric
        self.exact_below = EXACT_BELOW if exact_below is None else exact_below  # read now: bench sets it
        self._matrix = np.zeros((0, dimensions), dtype=np.float32)
        self._size = 0
        self._keys = np.zeros(0, dtype=np.int64)
        self._row: dict[int, int] = {}  # key -> its row in the matrix
        self._graph = None  # usearch.index.Index, once the index holds exact_below vectors

    def __len__(self) -> int:
        return self._size

    @property
    def approximate(self) -> bool:
        return self._graph is not None

    def keys(self) -> np.ndarray:
        return self._keys[: self._size]

    def _prepared(self, vectors: np.ndarray) -> np.ndarray:
        vectors = np.asarray(vectors, dtype=np.float32).reshape(-1, self.dimensions)
        return unit(vectors) if self.metric == "cosine" else vectors

    def add(self, keys: list[int], vectors: np.ndarray) -> None:
        """Add (or replace) the vectors under `keys`."""
        self.remove([k for k in keys if k in self._row])
        rows = self._prepared(vectors)
        need = self._size + len(keys)
        if need > len(self._matrix):
            grown = max(need, 2 * len(self._matrix), 1024)
            self._matrix = np.resize(self._matrix, (grown, self.dimensions))
            self._keys = np.resize(self._keys, grown)
        self._matrix[self._size : need] = rows
        self._keys[self._size : need] = keys
        for i, key in enumerate(keys):
            self._row[key] = self._size + i
        self._size = need
        if self._graph is not None:
            self._graph.add(np.asarray(keys, dtype=np.int64), rows)
        elif self._size >= self.exact_below:
            self._build_graph()

    def remove(self, keys: list[int]) -> None:
        """Drop the vectors under `keys` (unknown keys are ignored)."""
        for key in keys:
            row = self._row.pop(key, None)
            if row is None:
                continue
            last = self._size - 1
            if row != last:  # the last row takes the freed one's place
                self._matrix[row] = self._matrix[last]
                moved = int(self._keys[last])
                self._keys[row] = moved
                self._row[moved] = row
            self._size = last
            if self._graph is not None:
                self._graph.remove(key)

    def vector(self, key: int) -> np.ndarray:
        return self._matrix[self._row[key]]

    def _build_graph(self) -> None:
        from usearch.index import Index

        # int8 graph: 2-5x faster to build than f32 on 2 cores at about the same recall, since
        # every candidate is re-scored from the float32 matrix anyway
        graph = Index(
            ndim=self.dimensions,
            metric=_USEARCH_METRIC[self.metric],
            dtype="i8" if self.metric == "cosine" else "f16",
            expansion_add=64,
            expansion_search=EXPANSION_SEARCH,
        )
        graph.add(self.keys().copy(), self._matrix[: self._size])
        self._graph = graph

    def _scores(self, rows: np.ndarray, query: np.ndarray) -> np.ndarray:
        if self.metric == "euclidean":
            return np.linalg.norm(rows - query, axis=1)
        return rows @ query

    def _top(self, keys: np.ndarray, scores: np.ndarray, k: int) -> list[tuple[int, float]]:
        k = min(k, len(keys))
        if k == 0:
            return []
        order = scores if self.metric == "euclidean" else -scores
        best = np.argpartition(order, k - 1)[:k] if k < len(keys) else np.arange(len(keys))
        best = best[np.lexsort((keys[best], order[best]))]  # ties by key: the same answer each time
        return [(int(keys[i]), float(scores[i])) for i in best]

    def exact(self, query: np.ndarray, k: int, allowed: list[int] | None = None) -> list[tuple[int, float]]:
        """The k nearest (key, score), best first, scoring every vector (or every `allowed` one)."""
        q = self._prepared(query)[0]
        if allowed is None:
            keys, rows = self.keys(), self._matrix[: self._size]
        else:
            keys = np.asarray([k for k in allowed if k in self._row], dtype=np.int64)
            rows = self._matrix[[self._row[int(k)] for k in keys]] if len(keys) else self._matrix[:0]
        return self._top(keys, self._scores(rows, q), k)

    def search(self, query: np.ndarray, k: int, allowed: list[int] | None = None) -> list[tuple[int, float]]:
        """The k nearest, exact below exact_below vectors (or over `allowed`), else HNSW candidates
        re-scored exactly."""
        if self._graph is None or allowed is not None:
            return self.exact(query, k, allowed)
        q = self._prepared(query)[0]
        wanted = min(self._size, max(CANDIDATES_PER_RESULT * k, MIN_CANDIDATES))
        found = self._graph.search(q, wanted)
        keys = np.asarray([int(key) for key in found.keys if int(key) in self._row], dtype=np.int64)
        rows = self._matrix[[self._row[int(key)] for key in keys]] if len(keys) else self._matrix[:0]
        return self._top(keys, self._scores(rows, q), k)
