"""Retrieval-augmented answers over your own documents, with Workers AI and Vectorize.

POST /documents {"documents": [{"text": "...", "id": "optional"}, ...]} embeds each text with
EMBEDDING_MODEL and upserts it into the Vectorize index env.VECTORIZE (its text in the metadata);
GET /?q=question (or POST / {"question": "..."}) embeds the question, takes the TOP_K nearest
passages and asks CHAT_MODEL with them in its prompt. The answer carries the matches and the
prompt it was given, so you can see what the model read."""

import hashlib
from urllib.parse import parse_qs, urlsplit

from workers import AIError, Response, WorkerEntrypoint

EMBEDDING_MODEL = "@cf/baai/bge-base-en-v1.5"  # 768 dimensions: the index must have as many
CHAT_MODEL = "@edge/zai-org/glm-4.5-mini"  # answers OpenAI's chat.completion shape, {"choices": [...]}
TOP_K = 3
TEXT_CHARS = 4000  # of each passage kept in its metadata (Vectorize holds 10 KiB of it)
MAX_DOCUMENTS = 100  # per POST: what one embedding call takes


def passage_id(text):
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        missing = [name for name in ("AI", "VECTORIZE") if name not in self.env]
        if missing:
            needs = f"this worker needs the bindings {missing} (wrangler.jsonc: ai, vectorize)\n"
            return Response(needs, status=501)
        url = urlsplit(request.url)
        try:
            if request.method == "POST" and url.path == "/documents":
                return await self.add(await request.json())
            if url.path == "/":
                if request.method == "POST":
                    body = await request.json()
                    question, max_tokens = body.get("question"), body.get("max_tokens", 128)
                else:
                    query = parse_qs(url.query)
                    question = query.get("q", [None])[0]
                    max_tokens = int(query.get("max_tokens", ["128"])[0])
                return await self.answer(question, max_tokens)
        except AIError as exc:
            return Response.json({"error": str(exc)}, status=400 if exc.code in (5004, 5006, 5007) else 503)
        except (TypeError, ValueError) as exc:  # a refused Vectorize call: the message says why
            return Response.json({"error": str(exc)}, status=400)
        except Exception as exc:  # the index is missing, say (create it: see README.md)
            return Response.json({"error": str(exc)}, status=503)
        return Response("not found\n", status=404)

    async def add(self, body):
        documents = body.get("documents") if isinstance(body, dict) else None
        if not isinstance(documents, list) or not 1 <= len(documents) <= MAX_DOCUMENTS:
            hint = f'send {{"documents": [{{"text": "..."}}]}}, 1 to {MAX_DOCUMENTS} of them'
            return Response.json({"error": hint}, status=400)
        texts = [d.get("text") if isinstance(d, dict) else d for d in documents]
        if not all(isinstance(t, str) and t.strip() for t in texts):
            return Response.json({"error": "each document needs a non-empty text"}, status=400)
        embedded = await self.env.AI.run(EMBEDDING_MODEL, {"text": texts})
        vectors = [
            {
                "id": (d.get("id") if isinstance(d, dict) and d.get("id") else passage_id(text)),
                "values": values,
                "metadata": {"text": text[:TEXT_CHARS]},
            }
            for d, text, values in zip(documents, texts, embedded.data, strict=True)
        ]
        await self.env.VECTORIZE.upsert(vectors)
        return Response.json({"upserted": [v["id"] for v in vectors]}, status=201)

    async def answer(self, question, max_tokens):
        if not isinstance(question, str) or not question.strip():
            return Response.json({"error": 'ask with ?q=... or POST {"question": "..."}'}, status=400)
        embedded = await self.env.AI.run(EMBEDDING_MODEL, {"text": [question]})
        found = await self.env.VECTORIZE.query(embedded.data[0], {"topK": TOP_K, "returnMetadata": "all"})
        passages = [m.metadata["text"] for m in found.matches]
        context = "\n".join(f"[{i + 1}] {text}" for i, text in enumerate(passages))
        # the prompt's shape is the one the miniatures were trained on (models/recipe/chat_examples.py)
        system = "Answer the question from these passages.\n" + (context or "(none: POST some first)")
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        chat = await self.env.AI.run(CHAT_MODEL, {"messages": messages, "max_tokens": max_tokens})
        choices = chat.get("choices")
        text = choices[0]["message"]["content"] if choices else chat.get("response")
        matches = [{"id": m.id, "score": m.score, "text": m.metadata["text"]} for m in found.matches]
        return Response.json({"answer": text, "matches": matches, "prompt": messages})
