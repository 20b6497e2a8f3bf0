"""How often AI Search's answers quote the chunk that answers the question: chat completions over
the held-out generated corpus (bench/ai_search_corpus.py), through a real `edge dev` and its REST
door, answered by each shipped miniature, greedy.

    python bench/ai_search_answers.py [--questions 40] [--docs 300] [--max-tokens 64] [--json]

For each question (the first N of each subset), one POST .../instances/docs/chat/completions with
`max_num_results` 3. Counted per model and subset:
- retrieved: the answer's passage is among the chunks the answer was given (retrieval's part);
- quotes: the answer holds 6 consecutive words of the answer's passage (the model copied it);
- value: every number of the passage appears in the answer (the fact itself, copied or not).
The miniatures are trained to copy poorly (issue 56): this measures where that leaves AI Search.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.ai_search_corpus import heldout  # noqa: E402
from runtime.bench.devserver import start_dev  # noqa: E402

MODELS = ["@edge/zai-org/glm-4.5-mini", "@edge/moonshotai/kimi-k2-mini"]
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    return [w.casefold() for w in _WORD.findall(text)]


def quotes(answer: str, passage: str, n: int = 6) -> bool:
    said = " ".join(words(answer))
    source = words(passage)
    return any(" ".join(source[i : i + n]) in said for i in range(max(1, len(source) - n + 1)))


def has_value(answer: str, passage: str) -> bool:
    numbers = re.findall(r"\d+", passage)
    return bool(numbers) and all(n in answer for n in numbers)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--questions", type=int, default=40, help="per subset")
    ap.add_argument("--docs", type=int, default=300)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    corpus = heldout(args.docs)
    picked = {
        subset: [q for q in corpus.questions if q.subset == subset][: args.questions]
        for subset in ("shared", "paraphrased")
    }
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as d:
        folder = Path(d)
        (folder / "worker.py").write_text(
            "from workers import Response\n\nasync def on_fetch(request, env):\n    return Response('ok')\n"
        )
        models = ", ".join(f'"{m}"' for m in MODELS)
        (folder / "wrangler-like.toml").write_text(
            textwrap.dedent(f"""
            name = "ai-search-answers"
            main = "worker.py"
            compatibility_date = "2026-11-01"
            [edge]
            pops = ["ICN"]
            models = [{models}]
            models_dir = "{REPO / "models"}"
            """)
        )
        proc, url = start_dev(folder, {})
        try:
            token = (folder / ".edge" / "api-token").read_text().strip()
            client = httpx.Client(headers={"authorization": f"Bearer {token}"}, timeout=300)
            base = f"{url}/client/v4/accounts/local/ai-search/namespaces/default/instances"
            client.post(base, json={"id": "docs"}).raise_for_status()
            for doc in corpus.documents:
                client.post(
                    f"{base}/docs/items", files={"file": (doc.key, doc.markdown.encode(), "text/markdown")}
                ).raise_for_status()
            while (s := client.get(f"{base}/docs/stats").json()["result"])["queued"] + s["running"]:
                time.sleep(0.2)
            for model in MODELS:
                for subset, questions in picked.items():
                    row = {"questions": 0, "retrieved": 0, "quotes": 0, "value": 0, "answers": []}
                    for q in questions:
                        body = {
                            "messages": [{"role": "user", "content": q.text}],
                            "model": model,
                            "max_tokens": args.max_tokens,
                            "temperature": 0,
                            "ai_search_options": {"retrieval": {"max_num_results": 3}},
                        }
                        r = client.post(f"{base}/docs/chat/completions", json=body)
                        r.raise_for_status()
                        out = r.json()
                        out = out.get("result", out)  # the completion, bare as OpenAI's (or enveloped)
                        text = out["choices"][0]["message"]["content"] or ""
                        row["questions"] += 1
                        row["retrieved"] += any(q.passage in c["text"] for c in out["chunks"])
                        row["quotes"] += quotes(text, q.passage)
                        row["value"] += has_value(text, q.passage)
                        if len(row["answers"]) < 3:
                            row["answers"].append({"question": q.text, "passage": q.passage, "answer": text})
                    results[f"{model} {subset}"] = row
        finally:
            proc.terminate()
            proc.wait(30)
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"{args.docs} documents, {args.questions} questions a subset, max_tokens {args.max_tokens}, greedy")
    print("| model | subset | passage retrieved | answer quotes it | answer holds its numbers |")
    print("| --- | --- | ---: | ---: | ---: |")
    for name, row in results.items():
        model, subset = name.rsplit(" ", 1)
        n = max(1, row["questions"])
        print(
            f"| {model} | {subset} | {row['retrieved'] / n:.0%} | {row['quotes'] / n:.0%} "
            f"| {row['value'] / n:.0%} |"
        )
    for name, row in results.items():
        for a in row["answers"][:1]:
            print(
                f"\n{name}: {a['question']!r}\n  passage: {a['passage']!r}\n  answer:  {a['answer'][:200]!r}"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
