"""AI Search's retrieval on the held-out generated corpus: recall@1 and @5 of `search` per subset
(questions that share words with their answer, paraphrased ones that share none) and per
retrieval_type, with the hashed stand-in and the trained embedder on the same set, and indexing
throughput.

    python bench/ai_search_retrieval.py                    # the table (both embedders, the service)
    python bench/ai_search_retrieval.py --json             # the same as JSON
    python bench/ai_search_retrieval.py --embedders-only   # vector recall of the embedders alone
    python bench/ai_search_retrieval.py --record           # also write models/ai-search-embedder/heldout.json
    python bench/ai_search_retrieval.py --match-mode both --fusion both   # + keyword "or", fusion "max"

The corpus is bench/ai_search_corpus.py's held-out set (300 documents of about 2 KB, 300 shared and
300 paraphrased questions). Each embedder gets its own AI Search service
(runtime.ai.search.service.AISearch) in a temporary state dir: account "bench", one instance with
chunk_size and chunk_overlap pinned (256 tokens, 10%: Cloudflare's defaults, passed explicitly),
every document uploaded with item_upload and waited for with item_wait; indexing throughput is the
documents over the seconds from the first upload to the last item completed (conversion, chunking,
embedding, keyword index and SQLite, all included). Then each question is searched with
max_num_results 5 for each retrieval_type (the instance's other options at their defaults:
keyword_match_mode "and", fusion_method "rrf"; --match-mode and --fusion add the other settings as
rows of their own, e.g. "hybrid(or, max)").

A hit at rank k is a returned chunk whose item key is the answer's document and whose text holds the
answer's sentence (whitespace folded): chunk recall. Document recall counts any chunk of the right
document. The stand-in is runtime.ai.embeddings' hashed n-grams (768 dimensions); the trained one is
runtime/ai/search/embedder.py's TrainedEmbedder over models/ai-search-embedder/.

--record writes what default_embedder() reads: both embedders' recall on the paraphrased subset
(hybrid through the service, or vector alone with --embedders-only), so that the trained model is
served only while it beats the stand-in on the same questions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.ai_search_corpus import Corpus, chunk_texts, heldout, normalize_space  # noqa: E402
from runtime.ai.search.embedder import HashedNgrams, model_folder, trained_embedder  # noqa: E402

ACCOUNT, NS, INSTANCE = "bench", "default", "bench"
SUBSETS = ("shared", "paraphrased")
TYPES = ("vector", "keyword", "hybrid")


def embedders(which: str, folder: Path | None = None) -> dict[str, object]:
    out: dict[str, object] = {}
    if which in ("both", "stand_in"):
        out["stand_in"] = HashedNgrams()
    if which in ("both", "trained"):
        out["trained"] = trained_embedder(folder)
    return out


def _scores(ranked: list[list[tuple[str, str]]], corpus: Corpus) -> dict[str, dict[str, float]]:
    """Recall per subset from each question's ranked (item key, chunk text) list."""
    out: dict[str, dict[str, float]] = {}
    for subset in SUBSETS:
        rows = [(q, r) for q, r in zip(corpus.questions, ranked, strict=True) if q.subset == subset]
        hit = [
            [k == q.key and normalize_space(q.passage) in normalize_space(t) for k, t in r] for q, r in rows
        ]
        doc = [[k == q.key for k, _ in r] for q, r in rows]
        n = len(rows)
        out[subset] = {
            "questions": n,
            "recall@1": sum(bool(h[:1] and h[0]) for h in hit) / n,
            "recall@5": sum(any(h[:5]) for h in hit) / n,
            "doc_recall@1": sum(bool(d[:1] and d[0]) for d in doc) / n,
            "doc_recall@5": sum(any(d[:5]) for d in doc) / n,
        }
    return out


def embedders_only(corpus: Corpus, models: dict, size: int, overlap: int) -> dict:
    """Vector recall of each embedder alone: every chunk (context and text, as the indexer embeds
    it) against every question, exact cosine, in numpy."""
    chunks = [(d.key, ctx, text) for d in corpus.documents for ctx, text in chunk_texts(d, size, overlap)]
    results = {}
    for label, model in models.items():
        started = time.perf_counter()
        matrix = model.embed([f"{ctx}\n{text}" if ctx else text for _, ctx, text in chunks])
        seconds = time.perf_counter() - started
        queries = model.embed([q.text for q in corpus.questions])
        top = np.argsort(-(queries @ matrix.T), axis=1, kind="stable")[:, :5]
        ranked = [[(chunks[j][0], chunks[j][2]) for j in row] for row in top]
        results[label] = {
            "name": model.name,
            "dimensions": model.dimensions,
            "embed_ms_per_document": 1000 * seconds / len(corpus.documents),
            "vector": _scores(ranked, corpus),
        }
    return results


async def _service_run(
    corpus: Corpus, model, size: int, overlap: int, modes: list[str], fusions: list[str]
) -> dict:
    from runtime.ai.search.service import AISearch

    with tempfile.TemporaryDirectory(prefix="ais-bench-") as tmp:
        svc = AISearch(Path(tmp), embedder=model)
        try:
            await svc.instance_create(
                ACCOUNT, NS, {"id": INSTANCE, "chunk_size": size, "chunk_overlap": overlap}
            )
            started = time.perf_counter()
            ids = []
            for doc in corpus.documents:
                item = await svc.item_upload(ACCOUNT, NS, INSTANCE, doc.key, doc.markdown.encode())
                ids.append(item["id"])
            statuses = [
                (await svc.item_wait(ACCOUNT, NS, INSTANCE, i, timeout_s=300.0))["status"] for i in ids
            ]
            seconds = time.perf_counter() - started
            stats = await svc.instance_stats(ACCOUNT, NS, INSTANCE)
            out: dict = {
                "name": model.name,
                "dimensions": model.dimensions,
                "indexing": {
                    "documents": len(ids),
                    "completed": statuses.count("completed"),
                    "seconds": seconds,
                    "documents_per_s": len(ids) / seconds,
                    "chunks": stats["engine"]["vectorize"]["vectorsCount"],
                },
            }
            variants = [("vector", "and", "rrf")]
            variants += [("keyword", mode, "rrf") for mode in modes]
            variants += [("hybrid", mode, fusion) for mode in modes for fusion in fusions]
            for kind, mode, fusion in variants:
                extra = [x for x in (mode if mode != "and" else "", fusion if fusion != "rrf" else "") if x]
                label = kind + (f"({', '.join(extra)})" if extra else "")
                ranked, latencies = [], []
                for q in corpus.questions:
                    retrieval = {"retrieval_type": kind, "max_num_results": 5}
                    if kind != "vector":
                        retrieval["keyword_match_mode"] = mode
                    if kind == "hybrid":
                        retrieval["fusion_method"] = fusion
                    t0 = time.perf_counter()
                    found = await svc.search(
                        ACCOUNT,
                        NS,
                        [INSTANCE],
                        {"query": q.text, "ai_search_options": {"retrieval": retrieval}},
                    )
                    latencies.append(time.perf_counter() - t0)
                    ranked.append([(c["item"]["key"], c["text"]) for c in found["chunks"]])
                out[label] = _scores(ranked, corpus)
                out[label]["search_ms_p50"] = 1000 * float(np.percentile(latencies, 50))
            return out
        finally:
            svc.close()


def service(
    corpus: Corpus, models: dict, size: int, overlap: int, modes: list[str], fusions: list[str]
) -> dict:
    return {
        label: asyncio.run(_service_run(corpus, m, size, overlap, modes, fusions))
        for label, m in models.items()
    }


def table(results: dict) -> str:
    lines = [
        "| embedder | retrieval | shared R@1 | shared R@5 | para R@1 | para R@5 "
        "| shared doc R@5 | para doc R@5 |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results.values():
        for kind, v in r.items():
            if not isinstance(v, dict) or "shared" not in v:
                continue
            s, p = v["shared"], v["paraphrased"]
            lines.append(
                f"| {r['name']} | {kind} | {s['recall@1']:.1%} | {s['recall@5']:.1%} | {p['recall@1']:.1%} | "
                f"{p['recall@5']:.1%} | {s['doc_recall@5']:.1%} | {p['doc_recall@5']:.1%} |"
            )
    lines.append("")
    for r in results.values():
        if "indexing" in r:
            i = r["indexing"]
            lines.append(
                f"{r['name']}: indexed {i['completed']}/{i['documents']} documents ({i['chunks']} chunks) "
                f"in {i['seconds']:.1f}s = {i['documents_per_s']:.1f} documents/s"
            )
        if "embed_ms_per_document" in r:
            lines.append(
                f"{r['name']}: embedding {r['embed_ms_per_document']:.2f} ms a document (its chunks)"
            )
    return "\n".join(lines)


def record(results: dict, kind: str, corpus: Corpus, size: int, overlap: int, how: str) -> Path:
    path = model_folder() / "heldout.json"
    body = {
        "what": "recall on bench/ai_search_corpus.py's held-out set, both embedders on the same questions",
        "how": how,
        "retrieval_type": kind,
        "chunk_size": size,
        "chunk_overlap": overlap,
        "documents": len(corpus.documents),
        "questions": {s: sum(q.subset == s for q in corpus.questions) for s in SUBSETS},
        "host": platform.node() or "unknown",
    }
    for subset in SUBSETS:
        body[subset] = {
            label: {"name": r["name"], **{k: r[kind][subset][k] for k in ("recall@1", "recall@5")}}
            for label, r in results.items()
        }
    body["table"] = results
    path.write_text(json.dumps(body, indent=2) + "\n")
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--embedders-only", action="store_true", help="vector recall of the embedders alone (numpy)"
    )
    parser.add_argument("--embedder", choices=("both", "stand_in", "trained"), default="both")
    parser.add_argument("--docs", type=int, default=300)
    parser.add_argument("--chunk-size", type=int, default=256)
    parser.add_argument("--chunk-overlap", type=int, default=10)
    parser.add_argument("--match-mode", choices=("and", "or", "both"), default="and")
    parser.add_argument("--fusion", choices=("rrf", "max", "both"), default="rrf")
    parser.add_argument("--model", type=Path, help="the trained model's folder (default: the shipped one)")
    parser.add_argument("--record", action="store_true", help="write models/ai-search-embedder/heldout.json")
    args = parser.parse_args(argv)
    corpus = heldout(args.docs)
    models = embedders(args.embedder, args.model)
    modes = ["and", "or"] if args.match_mode == "both" else [args.match_mode]
    if args.embedders_only:
        results = embedders_only(corpus, models, args.chunk_size, args.chunk_overlap)
        kind, how = "vector", "bench/ai_search_retrieval.py --embedders-only (numpy, exact cosine)"
    else:
        fusions = ["rrf", "max"] if args.fusion == "both" else [args.fusion]
        results = service(corpus, models, args.chunk_size, args.chunk_overlap, modes, fusions)
        kind, how = "hybrid", "bench/ai_search_retrieval.py (AISearch.search, hybrid, keyword_match_mode and)"
    if args.record:
        if not args.embedders_only and (modes[0] != "and" or fusions[0] != "rrf"):
            raise SystemExit(
                "--record measures the instance's defaults: keep --match-mode and --fusion at and, rrf"
            )
        if set(models) != {"stand_in", "trained"} or args.model:
            raise SystemExit(
                "--record compares both embedders, the shipped model: leave --embedder and --model out"
            )
        print(
            f"recorded {record(results, kind, corpus, args.chunk_size, args.chunk_overlap, how)}",
            file=sys.stderr,
        )
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        q = {s: sum(x.subset == s for x in corpus.questions) for s in SUBSETS}
        print(
            f"{len(corpus.documents)} documents, {q['shared']} shared and {q['paraphrased']} paraphrased "
            f"questions, chunk_size {args.chunk_size}, chunk_overlap {args.chunk_overlap}%\n"
        )
        print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
