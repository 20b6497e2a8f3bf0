"""Cloudflare's AI Search examples in Python, call for call, over the documents in docs/.

GET  /search?q=...         env.AI_SEARCH.get("docs").search({...})         retrieval only: the chunks
GET  /ask?q=...            env.DOCS.chatCompletions({...})                   an answer and its chunks
GET  /ask?q=...&stream=1   env.DOCS.chatCompletions({..., "stream": True})  the answer as it comes (SSE)
GET  /legacy?q=...         env.AI.autorag("docs").aiSearch({...})            the legacy binding's format
POST /upload?name=x.md     env.DOCS.items.uploadAndPoll(name, body)          add a document, searchable now
GET  /items                env.DOCS.items.list({...})                        what the instance holds
GET  /stats                env.DOCS.stats()                                  indexing progress
"""

from urllib.parse import parse_qs, urlsplit

from workers import Response, WorkerEntrypoint
from workers.ai_search import AiSearchError

MODEL = "@cf/meta/llama-3.3-70b-instruct-fp8-fast"  # served here by the GLM-4.5 miniature


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlsplit(request.url)
        query = {k: v[0] for k, v in parse_qs(url.query).items()}
        question = query.get("q", "How long are responses cached?")
        try:
            if url.path == "/search":
                # const instance = env.AI_SEARCH.get("my-instance");
                # const results = await instance.search({ messages: [...] });
                instance = self.env.AI_SEARCH.get("docs")
                results = await instance.search(
                    {
                        "messages": [{"role": "user", "content": question}],
                        "ai_search_options": {"retrieval": {"max_num_results": 3}},
                    }
                )
                return Response.json(results.to_py())
            if url.path == "/ask":
                # await env.MY_SEARCH.chatCompletions({ messages, model, ai_search_options });
                ask = {
                    "messages": [
                        {"role": "system", "content": "You are a helpful documentation assistant."},
                        {"role": "user", "content": question},
                    ],
                    "model": MODEL,
                    "max_tokens": 64,
                    "ai_search_options": {"retrieval": {"max_num_results": 3}},
                }
                if query.get("stream"):
                    # return new Response(stream, { headers: { "content-type": "text/event-stream" } });
                    stream = await self.env.DOCS.chatCompletions({**ask, "stream": True})
                    return Response(
                        stream, headers={"content-type": "text/event-stream", "cache-control": "no-cache"}
                    )
                answer = await self.env.DOCS.chatCompletions(ask)
                return Response.json(
                    {
                        "answer": answer.choices[0].message.content,
                        "sources": [chunk.item.key for chunk in answer.chunks],
                    }
                )
            if url.path == "/legacy":
                # const answer = await env.AI.autorag("my-autorag").aiSearch({ query, model, ... });
                answer = await self.env.AI.autorag("docs").aiSearch(
                    {"query": question, "model": MODEL, "max_num_results": 2}
                )
                return Response.json(answer.to_py())
            if url.path == "/upload" and request.method == "POST":
                # await instance.items.uploadAndPoll("guide.pdf", pdfBuffer, { timeoutMs: 60_000 });
                name = query.get("name", "upload.md")
                item = await self.env.DOCS.items.uploadAndPoll(
                    name, await request.text(), {"timeoutMs": 60_000}
                )
                return Response.json(item.to_py())
            if url.path == "/items":
                # const { result: items, result_info } = await instance.items.list({ page: 1, per_page: 50 });
                listed = await self.env.DOCS.items.list({"page": 1, "per_page": 50})
                return Response.json(
                    {"items": [i.key for i in listed.result], "total": listed.result_info.total_count}
                )
            if url.path == "/stats":
                return Response.json((await self.env.DOCS.stats()).to_py())
        except AiSearchError as exc:  # AiSearchNotFoundError, AiSearchInternalError: the message says why
            return Response.json(
                {"error": str(exc), "name": exc.name}, status=404 if exc.code == 7002 else 400
            )
        return Response(
            "GET /search?q=..., /ask?q=..., /legacy?q=..., /items, /stats; POST /upload\n", status=404
        )
