"""Retrieval over one instance's chunks: vector (cosine of the embedder's unit vectors, exact, in
memory), keyword (SQLite FTS5's BM25 over the chunk and its headings, Porter-stemmed) and hybrid
(both, fused by reciprocal rank, `rrf`, or by the larger of the two scores, `max`), with
Cloudflare's options: match_threshold on the vector similarity, max_num_results, metadata filters
applied before ranking, keyword_match_mode (`and`: every query word; `or`: any), context_expansion
(neighbouring chunks joined to each result), boost_by, and a reranking pass.

An instance's vectors are loaded from the file once and kept (Loaded) until its version moves
(an item indexed or deleted, here or by the CLI in another process).
"""

from __future__ import annotations

import json
import re
import threading
import unicodedata
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from runtime.ai.embeddings import STOP_WORDS
from runtime.ai.search.filters import Check, attributes
from runtime.ai.search.store import SearchStore

RRF_K = 60
KEYWORD_HALF = 5.0  # the BM25 score that maps to a keyword_score of 0.5
CANDIDATES = 100  # each side's candidates before fusion
RERANKER = "edge/rerank-overlap-v1"
_WORD = re.compile(r"\w+", re.UNICODE)
# a question's own words, which the passage answering it seldom holds: dropped from the keyword
# query beside the stop words, so that "and" asks only for what the answer is about
QUESTION_WORDS = frozenset(
    "about after all also am any been before being both but could did do does doing during each "
    "few had having he her here hers him his how if into just many me more most much my no nor not "
    "now off once only other our ours over own same she should so some such than their theirs them "
    "then there these they those through too under until up very we whom whose would yours "
    "far big long often".split()
)


@dataclass
class Loaded:
    version: int
    rowids: np.ndarray  # (n,) int64
    vectors: np.ndarray  # (n, d) float32, unit rows
    items: list[str]  # item id per chunk
    seqs: np.ndarray  # (n,) int32
    item_attrs: dict[str, dict[str, Any]] = field(default_factory=dict)  # by item id
    row_of: dict[int, int] = field(default_factory=dict)  # chunk rowid -> its row here


@dataclass(frozen=True)
class Options:
    retrieval_type: str = "hybrid"
    match_threshold: float = 0.0
    max_num_results: int = 10
    fusion_method: str = "rrf"
    keyword_match_mode: str = "and"
    context_expansion: int = 0
    boost_by: tuple[tuple[str, str], ...] = ()
    rerank: bool = False
    rerank_threshold: float = 0.0
    filter: Check | None = None


@dataclass
class Hit:
    rowid: int
    item_id: str
    score: float
    vector_score: float | None = None
    keyword_score: float | None = None
    vector_rank: int | None = None
    keyword_rank: int | None = None
    reranking_score: float | None = None


class Retriever:
    def __init__(self, store: SearchStore):
        self.store = store
        self._loaded: dict[tuple[str, str, str], Loaded] = {}
        self._locks: dict[tuple[str, str, str], threading.Lock] = {}
        self._guard = threading.Lock()

    def forget(self, account: str, ns: str, name: str) -> None:
        self._loaded.pop((account, ns, name), None)

    def loaded(self, account: str, ns: str, name: str, version: int, dimensions: int) -> Loaded:
        key = (account, ns, name)
        with self._guard:
            lock = self._locks.setdefault(key, threading.Lock())
        with lock:
            found = self._loaded.get(key)
            if found is not None and found.version == version:
                return found
            rows = self.store.execute(
                "SELECT rowid, item_id, seq, vec FROM chunks WHERE account = ? AND namespace = ? "
                "AND instance = ? ORDER BY rowid",
                key,
            )
            items = self.store.execute(
                "SELECT id, key, object_time, metadata FROM items WHERE account = ? AND namespace = ? "
                "AND instance = ? AND status = 'completed'",
                key,
            )
            attrs = {i: attributes(k, t, json.loads(m) if m else None) for i, k, t, m in items}
            # a chunk of another width is an old embedder's, waiting to be indexed again
            rows = [r for r in rows if r[1] in attrs and len(r[3]) == dimensions * 4]
            vectors = (
                np.frombuffer(b"".join(bytes(r[3]) for r in rows), dtype=np.float32).reshape(
                    len(rows), dimensions
                )
                if rows
                else np.zeros((0, dimensions), dtype=np.float32)
            )
            loaded = Loaded(
                version,
                np.array([r[0] for r in rows], dtype=np.int64),
                vectors,
                [r[1] for r in rows],
                np.array([r[2] for r in rows], dtype=np.int32),
                attrs,
            )
            loaded.row_of = {int(r): i for i, r in enumerate(loaded.rowids)}
            self._loaded[key] = loaded
            return loaded

    def keyword(
        self, key: tuple[str, str, str], query: str, mode: str, limit: int
    ) -> list[tuple[int, float]]:
        """(rowid, BM25 score, higher better) of the instance's chunks matching the query's words."""
        expression = fts_query(query, mode)
        if expression is None:
            return []
        rows = self.store.execute(
            "SELECT c.rowid, bm25(chunk_words, 1.0, 0.5) AS s FROM chunk_words "
            "JOIN chunks c ON c.rowid = chunk_words.rowid WHERE chunk_words MATCH ? "
            "AND c.account = ? AND c.namespace = ? AND c.instance = ? ORDER BY s LIMIT ?",
            (expression, *key, limit),
        )
        return [(int(r), -float(s)) for r, s in rows]

    def search(
        self, key: tuple[str, str, str], loaded: Loaded, query: str, query_vector: np.ndarray, opts: Options
    ) -> list[Hit]:
        n = len(loaded.rowids)
        if n == 0:
            return []
        allowed = np.ones(n, dtype=bool)
        if opts.filter is not None:
            ok = {i: opts.filter(a) for i, a in loaded.item_attrs.items()}
            allowed = np.fromiter((ok.get(i, False) for i in loaded.items), dtype=bool, count=n)
        similarity = loaded.vectors @ query_vector.astype(np.float32)
        hits: dict[int, Hit] = {}
        depth = max(CANDIDATES, opts.max_num_results * 4)
        if opts.retrieval_type in ("vector", "hybrid"):
            masked = np.where(allowed, similarity, -np.inf)
            top = np.argsort(-masked, kind="stable")[:depth]
            for rank, row in enumerate(int(r) for r in top if np.isfinite(masked[r])):
                rowid = int(loaded.rowids[row])
                hits[rowid] = Hit(rowid, loaded.items[row], 0.0, float(similarity[row]), None, rank + 1)
        if opts.retrieval_type in ("keyword", "hybrid"):
            rank = 0
            for rowid, bm25 in self.keyword(key, query, opts.keyword_match_mode, depth * 2):
                row = loaded.row_of.get(rowid)
                if row is None or not allowed[row]:
                    continue
                rank += 1
                hit = hits.get(rowid) or Hit(rowid, loaded.items[row], 0.0, float(similarity[row]))
                hit.keyword_score, hit.keyword_rank = bm25 / (bm25 + KEYWORD_HALF), rank
                hits[rowid] = hit
                if rank >= depth:
                    break
        for hit in hits.values():
            if hit.vector_score is None:
                hit.vector_score = float(similarity[loaded.row_of[hit.rowid]])
            hit.score = _fused(hit, opts)
        kept = [h for h in hits.values() if (h.vector_score or 0.0) >= opts.match_threshold]
        if opts.boost_by:
            _boost(kept, loaded, opts.boost_by)
        kept.sort(key=lambda h: (-h.score, h.rowid))
        return kept[
            : max(opts.max_num_results * 3, opts.max_num_results) if opts.rerank else opts.max_num_results
        ]


def _fused(hit: Hit, opts: Options) -> float:
    if opts.retrieval_type == "vector":
        return max(0.0, hit.vector_score or 0.0)
    if opts.retrieval_type == "keyword":
        return hit.keyword_score or 0.0
    if opts.fusion_method == "max":
        return max(max(0.0, hit.vector_score or 0.0), hit.keyword_score or 0.0)
    rrf = sum(1.0 / (RRF_K + r) for r in (hit.vector_rank, hit.keyword_rank) if r is not None)
    return rrf / (2.0 / (RRF_K + 1))  # 1.0: first on both sides


def _boost(hits: list[Hit], loaded: Loaded, boosts: tuple[tuple[str, str], ...]) -> None:
    """Each boost moves a hit by at most 10% of its score: freshness or a field breaks near-ties."""
    for name, direction in boosts:
        values = [loaded.item_attrs.get(h.item_id, {}).get(name) for h in hits]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        lo, hi = (min(numbers), max(numbers)) if numbers else (0.0, 0.0)
        for hit, value in zip(hits, values, strict=True):
            if direction in ("exists", "not_exists"):
                gain = 1.0 if (value is not None) == (direction == "exists") else 0.0
            elif isinstance(value, int | float) and not isinstance(value, bool) and hi > lo:
                gain = (value - lo) / (hi - lo)
                gain = gain if direction == "desc" else 1.0 - gain
            else:
                gain = 0.0
            hit.score *= 1.0 + 0.1 * gain


def words(text: str) -> list[str]:
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def fts_query(query: str, mode: str) -> str | None:
    """An FTS5 expression of the query's words (each quoted: no operator a client types reaches
    FTS5's syntax), stop words dropped unless nothing else is left, joined by AND or OR."""
    found = list(dict.fromkeys(words(query)))[:64]
    content = [w for w in found if w not in STOP_WORDS and w not in QUESTION_WORDS] or found
    if not content:
        return None
    joiner = " AND " if mode == "and" else " OR "
    return joiner.join('"' + w.replace('"', '""') + '"' for w in content)


def rerank(
    hits: list[Hit],
    query: str,
    query_vector: np.ndarray,
    texts: dict[int, str],
    vectors: dict[int, np.ndarray],
) -> None:
    """The local reranker (RERANKER, disclosed in scoring_details): the chunk text's own cosine to
    the query (without its headings) and the share of the query's content words it holds, each
    half; a stand-in for a cross-encoder such as bge-reranker-base, which does not ship here."""
    wanted = {w for w in words(query) if w not in STOP_WORDS}
    for hit in hits:
        text_words = set(words(texts.get(hit.rowid, "")))
        share = len(wanted & text_words) / len(wanted) if wanted else 0.0
        cosine = float(vectors[hit.rowid] @ query_vector) if hit.rowid in vectors else 0.0
        hit.reranking_score = 0.5 * max(0.0, cosine) + 0.5 * share
        hit.score = hit.reranking_score
