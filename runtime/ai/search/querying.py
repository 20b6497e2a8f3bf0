"""AI Search's questions: search (vector, keyword or hybrid retrieval with Cloudflare's options, a
query rewrite and a rerank through the local models), chat completions over the chunks found, and
the legacy env.AI.autorag(name).search / aiSearch in their own shapes. Mixed into
runtime.ai.search.service.AISearch."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

from runtime.ai.search import settings as cfg
from runtime.ai.search.answers import (
    GENERATION_OPTIONS,
    answer_messages,
    answer_text,
    chat_completion,
    legacy_page,
    query_of,
    rewrite_messages,
    stream_chat,
    stream_legacy,
)
from runtime.ai.search.common import DEFAULT_NAMESPACE, Generate
from runtime.ai.search.embedder import Embedder
from runtime.ai.search.errors import GENERATION, INVALID, AISearchError
from runtime.ai.search.filters import compile_filter
from runtime.ai.search.retrieve import Hit, Options, Retriever, rerank
from runtime.ai.search.store import SearchStore

log = logging.getLogger("edge.ai_search")
MAX_INSTANCE_IDS = 10  # instances one namespace search reaches
RETRIEVAL_KEYS = {
    "retrieval_type",
    "match_threshold",
    "max_num_results",
    "filters",
    "context_expansion",
    "fusion_method",
    "keyword_match_mode",
    "boost_by",
    "return_on_failure",
}
OPTION_KEYS = {"retrieval", "query_rewrite", "reranking", "cache", "custom_metadata", "instance_ids"}


def _options_object(value: Any, where: str, known: set[str]) -> dict:
    """An options object (absent: {}), refusing a key it does not know by name, with the known ones."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise AISearchError(INVALID, f"{where}: an object")
    unknown = sorted(set(value) - known)
    if unknown:
        raise AISearchError(
            INVALID,
            f"{where}.{str(unknown[0])[:64]}: not an option; the options are: {', '.join(sorted(known))}",
        )
    return value


class Querying:
    """Search and answers (the state is AISearch's: store, retriever, embedder)."""

    store: SearchStore
    retriever: Retriever
    embedder: Embedder

    # --- retrieval -------------------------------------------------------------------------------------

    def _options(self, config: dict, options: dict) -> Options:
        r = dict(_options_object(options.get("retrieval"), "ai_search_options.retrieval", RETRIEVAL_KEYS))
        index_method = config.get("index_method") or {"vector": True, "keyword": True}
        default_type = (
            "hybrid"
            if index_method.get("keyword") and index_method.get("vector", True)
            else ("keyword" if index_method.get("keyword") else "vector")
        )
        kind = r.get("retrieval_type", default_type)
        if kind not in ("vector", "keyword", "hybrid"):
            raise AISearchError(
                INVALID, "ai_search_options.retrieval.retrieval_type: vector, keyword or hybrid"
            )
        if kind != "vector" and not index_method.get("keyword", True):
            raise AISearchError(
                INVALID,
                f"retrieval_type {kind!r}: this instance keeps no keyword index "
                "(index_method.keyword is false)",
            )
        cfg._float(r, "match_threshold", 0.0, 1.0)
        cfg._int(r, "max_num_results", 1, cfg.MAX_RESULTS)
        cfg._int(r, "context_expansion", 0, 3)
        cfg._choice(r, "fusion_method", ("rrf", "max"))
        cfg._choice(r, "keyword_match_mode", ("and", "or"))
        boosts = []
        for b in r.get("boost_by") or (config.get("retrieval_options") or {}).get("boost_by") or []:
            if not isinstance(b, dict) or not isinstance(b.get("field"), str):
                raise AISearchError(
                    INVALID, "ai_search_options.retrieval.boost_by: a list of {field, direction?}"
                )
            direction = b.get("direction", "desc" if b["field"] == "timestamp" else "exists")
            if direction not in ("asc", "desc", "exists", "not_exists"):
                raise AISearchError(INVALID, "boost_by.direction: asc, desc, exists or not_exists")
            boosts.append((b["field"], direction))
        reranking = options.get("reranking") or {}
        if not isinstance(reranking, dict) or set(reranking) - {"enabled", "match_threshold", "model"}:
            raise AISearchError(INVALID, "ai_search_options.reranking: {enabled?, match_threshold?, model?}")
        return Options(
            retrieval_type=kind,
            match_threshold=float(r.get("match_threshold", config.get("score_threshold", 0.0))),
            max_num_results=int(r.get("max_num_results", config.get("max_num_results", 10))),
            fusion_method=r.get("fusion_method", config.get("fusion_method", "rrf")),
            keyword_match_mode=r.get(
                "keyword_match_mode", (config.get("retrieval_options") or {}).get("keyword_match_mode", "and")
            ),
            context_expansion=int(r.get("context_expansion", 0)),
            boost_by=tuple(boosts),
            rerank=bool(reranking.get("enabled", config.get("reranking", False))),
            rerank_threshold=float(reranking.get("match_threshold", 0.0)),
            filter=compile_filter(r.get("filters")),
        )

    def _retrieve(
        self, account: str, ns: str, name: str, query: str, options: dict
    ) -> tuple[list[dict], Options]:
        row = self._instance_row(account, ns, name)
        opts = self._options(row["config"], options)
        embedder = self.embedder_of(row)
        vector = embedder.embed([query])[0]
        loaded = self.retriever.loaded(account, ns, name, row["version"], embedder.dimensions)
        hits = self.retriever.search((account, ns, name), loaded, query, vector, opts)
        texts = self._texts([h.rowid for h in hits])
        if opts.rerank and hits:
            vectors = {h.rowid: loaded.vectors[loaded.row_of[h.rowid]] for h in hits}
            rerank(hits, query, vector, {r: t for r, (t, _, _) in texts.items()}, vectors)
            hits = [h for h in hits if (h.reranking_score or 0.0) >= opts.rerank_threshold]
            hits.sort(key=lambda h: (-h.score, h.rowid))
            hits = hits[: opts.max_num_results]
        return [self._chunk_shape(h, texts, loaded, opts) for h in hits], opts

    def _texts(self, rowids: list[int]) -> dict[int, tuple[str, str, int]]:
        if not rowids:
            return {}
        marks = ",".join("?" * len(rowids))
        rows = self.store.execute(
            f"SELECT rowid, text, item_id, seq FROM chunks WHERE rowid IN ({marks})", tuple(rowids)
        )
        return {r: (t, i, s) for r, t, i, s in rows}

    def _chunk_shape(self, hit: Hit, texts: dict, loaded: Any, opts: Options) -> dict:
        text, item_id, seq = texts.get(hit.rowid, ("", hit.item_id, 0))
        if opts.context_expansion:
            around = self.store.execute(
                "SELECT text FROM chunks WHERE item_id = ? AND seq BETWEEN ? AND ? ORDER BY seq",
                (item_id, seq - opts.context_expansion, seq + opts.context_expansion),
            )
            text = "\n\n".join(t for (t,) in around)
        attrs = loaded.item_attrs.get(item_id, {})
        metadata = {k: v for k, v in attrs.items() if k not in ("filename", "folder", "timestamp")}
        details: dict[str, Any] = {"vector_score": hit.vector_score, "vector_rank": hit.vector_rank}
        if hit.keyword_score is not None:
            details.update(keyword_score=hit.keyword_score, keyword_rank=hit.keyword_rank)
        if opts.retrieval_type == "hybrid":
            details["fusion_method"] = opts.fusion_method
        if hit.reranking_score is not None:
            details["reranking_score"] = hit.reranking_score
        return {
            "id": f"{item_id}-{seq}",
            "type": "text",
            "score": round(float(hit.score), 6),
            "text": text,
            "item": {
                "key": attrs.get("filename"),
                "timestamp": attrs.get("timestamp", 0) / 1000.0,
                "metadata": metadata,
            },
            "scoring_details": details,
        }

    def _check_body(self, body: Any, extra: set[str]) -> tuple[str, dict]:
        if not isinstance(body, dict):
            raise AISearchError(INVALID, "the body is {query | messages, ai_search_options?}")
        unknown = sorted(set(body) - {"query", "messages", "ai_search_options"} - extra)
        if unknown:
            raise AISearchError(
                INVALID,
                f"{unknown[0][:64]}: not a parameter; send query or messages, and ai_search_options"
                + (f" ({', '.join(sorted(extra))})" if extra else ""),
            )
        query = query_of(body)
        return query, _options_object(body.get("ai_search_options"), "ai_search_options", OPTION_KEYS)

    async def _rewritten(
        self,
        account: str,
        ns: str,
        instances: list[str],
        query: str,
        options: dict,
        generate: Generate | None,
    ) -> str:
        rewrite = options.get("query_rewrite") or {}
        if not isinstance(rewrite, dict) or set(rewrite) - {"enabled", "model", "rewrite_prompt"}:
            raise AISearchError(
                INVALID, "ai_search_options.query_rewrite: {enabled?, model?, rewrite_prompt?}"
            )
        row = await self._run(account, self._instance_row, account, ns, instances[0])
        config = row["config"]
        if not rewrite.get("enabled", config.get("rewrite_query", False)) or generate is None:
            return query
        model = (
            rewrite.get("model")
            or config.get("rewrite_model")
            or config.get("ai_search_model")
            or cfg.DEFAULT_MODEL
        )
        prompt = rewrite.get("rewrite_prompt") or config.get("system_prompt_rewrite_query")
        try:
            answer = await generate(model, {"messages": rewrite_messages(query, prompt), "max_tokens": 64})
        except AISearchError:  # a rate limit, said as it is
            raise
        except Exception as exc:
            raise AISearchError(GENERATION, f"query rewrite with {model}: {str(exc)[:300]}") from None
        rewritten = answer_text(answer).strip()
        # searched beside the original: a miniature's rewrite can lose what the user asked
        return f"{query}\n{rewritten}" if rewritten and rewritten != query else query

    async def search(
        self,
        account: str,
        ns: str,
        instance_ids: list[str],
        body: Any,
        generate: Generate | None = None,
        extra: set[str] = frozenset(),
    ) -> dict:
        query, options = self._check_body(body, set(extra))
        names = self._instance_ids(options, instance_ids)
        search_query = await self._rewritten(account, ns, names, query, options, generate)
        results: list[dict] = []
        limit = 0
        for name in names:
            chunks, opts = await self._run(
                account, self._retrieve, account, ns, name, search_query, options, lane=("search", ns)
            )
            limit = max(limit, opts.max_num_results)
            for chunk in chunks:
                if len(names) > 1:
                    chunk["instance_id"] = name
                results.append(chunk)
        results.sort(key=lambda c: -c["score"])
        return {"search_query": search_query, "chunks": results[:limit], "query_kind": "text"}

    @staticmethod
    def _instance_ids(options: dict, given: list[str]) -> list[str]:
        ids = options.get("instance_ids")
        if ids is None:
            ids = given
        if (
            not isinstance(ids, list)
            or not ids
            or len(ids) > MAX_INSTANCE_IDS
            or not all(isinstance(i, str) for i in ids)
        ):
            raise AISearchError(
                INVALID, f"ai_search_options.instance_ids: a list of 1 to {MAX_INSTANCE_IDS} instance names"
            )
        if given and ids != given and not set(ids) <= set(given) and len(given) == 1:
            raise AISearchError(INVALID, "instance_ids are given to a namespace's search, not an instance's")
        return list(dict.fromkeys(ids))

    async def chat_completions(
        self, account: str, ns: str, instance_ids: list[str], body: Any, generate: Generate
    ) -> dict | AsyncIterator[bytes]:
        query, options = self._check_body(body, GENERATION_OPTIONS)
        names = self._instance_ids(options, instance_ids)
        found = await self.search(
            account,
            ns,
            names,
            {k: v for k, v in body.items() if k in ("query", "messages", "ai_search_options")},
            generate,
        )
        row = await self._run(account, self._instance_row, account, ns, names[0])
        config = row["config"]
        model = body.get("model") or config.get("ai_search_model") or cfg.DEFAULT_MODEL
        if not isinstance(model, str):
            raise AISearchError(INVALID, "model: a model name")
        messages = answer_messages(body, found["chunks"], config.get("system_prompt_ai_search"))
        inputs = {"messages": messages, **{k: body[k] for k in GENERATION_OPTIONS - {"model"} if k in body}}
        try:
            answer = await generate(model, inputs)
        except AISearchError:
            raise
        except Exception as exc:
            raise AISearchError(GENERATION, f"{model}: {str(exc)[:300]}") from None
        if body.get("stream"):
            return stream_chat(answer, model, found["chunks"])
        return chat_completion(answer, model, found["chunks"])

    # --- the legacy env.AI.autorag(name) -------------------------------------------------------------------

    def _legacy_body(self, body: Any, generation: bool) -> dict:
        allowed = {
            "query",
            "rewrite_query",
            "max_num_results",
            "ranking_options",
            "reranking",
            "filters",
            "stream",
        }
        if generation:
            allowed |= {"model", "system_prompt"}
        if not isinstance(body, dict) or not isinstance(body.get("query"), str) or not body["query"].strip():
            raise AISearchError(INVALID, "query: the question, a non-empty string")
        unknown = sorted(set(body) - allowed)
        if unknown:
            raise AISearchError(
                INVALID,
                f"{unknown[0][:64]}: not a parameter; the parameters are: {', '.join(sorted(allowed))}",
            )
        ranking = body.get("ranking_options") or {}
        if not isinstance(ranking, dict) or set(ranking) - {"score_threshold", "ranker"}:
            raise AISearchError(INVALID, "ranking_options: {score_threshold?, ranker?}")
        retrieval: dict[str, Any] = {"max_num_results": body.get("max_num_results", 10)}
        if "score_threshold" in ranking:
            retrieval["match_threshold"] = ranking["score_threshold"]
        if body.get("filters") is not None:
            retrieval["filters"] = body["filters"]
        options: dict[str, Any] = {
            "retrieval": retrieval,
            "query_rewrite": {"enabled": bool(body.get("rewrite_query", False))},
        }
        if body.get("reranking") is not None:
            options["reranking"] = body["reranking"]
        return {"query": body["query"], "ai_search_options": options}

    async def autorag_search(
        self, account: str, name: str, body: Any, generate: Generate | None = None
    ) -> dict:
        found = await self.search(
            account, DEFAULT_NAMESPACE, [name], self._legacy_body(body, False), generate
        )
        return legacy_page(found)

    async def autorag_ai_search(
        self, account: str, name: str, body: Any, generate: Generate
    ) -> dict | AsyncIterator[bytes]:
        request = self._legacy_body(body, True)
        found = await self.search(account, DEFAULT_NAMESPACE, [name], request, generate)
        row = await self._run(account, self._instance_row, account, DEFAULT_NAMESPACE, name)
        model = body.get("model") or row["config"].get("ai_search_model") or cfg.DEFAULT_MODEL
        prompt = body.get("system_prompt") or row["config"].get("system_prompt_ai_search")
        messages = answer_messages({"query": body["query"]}, found["chunks"], prompt)
        inputs: dict[str, Any] = {"messages": messages}
        if body.get("stream"):
            inputs["stream"] = True
        try:
            answer = await generate(model, inputs)
        except AISearchError:
            raise
        except Exception as exc:
            raise AISearchError(GENERATION, f"{model}: {str(exc)[:300]}") from None
        if body.get("stream"):
            return stream_legacy(answer)
        return {**legacy_page(found), "response": answer_text(answer)}
