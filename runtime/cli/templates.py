"""`edge init NAME --template T`: a new project folder that `edge dev` serves at once.

Each template writes worker.py (in Cloudflare Python Workers' own shapes, so the same file runs
there), wrangler.jsonc (wrangler's keys), README.md and a .gitignore for the runtime's state.
`fastapi` runs FastAPI through Cloudflare's `asgi` bridge; its pyproject.toml lists fastapi, which
`edge dev` installs (runtime.host.deps); without it the worker answers 501 saying so. `d1` uses the
D1 binding `env.DB` (wrangler.jsonc's d1_databases) and answers 501 naming it if it is missing.
`rag` embeds documents into a Vectorize index (env.VECTORIZE) and answers questions with the
chat model, the passages found in its prompt.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

MODEL = "@edge/moonshotai/kimi-k2-mini"


@dataclass(frozen=True)
class Template:
    description: str
    worker: str
    readme: str  # the template's own part of README.md
    config: dict[str, Any] = field(default_factory=dict)  # keys beyond name, main and the dates
    extra_files: dict[str, str] = field(default_factory=dict)


HELLO = """\
from workers import Response, WorkerEntrypoint


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return Response("Hello World!")
"""

AI_CHAT = """\
\"\"\"A chat endpoint: POST {"messages": [...]} (or GET /?q=...) streams the model's answer as
server-sent events, as Workers AI streams it.\"\"\"

from urllib.parse import parse_qs, urlsplit

from workers import AIError, Response, WorkerEntrypoint

MODEL = "@MODEL@"


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        if request.method == "POST":
            try:
                body = await request.json()
            except ValueError:
                body = None
            messages = body.get("messages") if isinstance(body, dict) else None
            if not isinstance(messages, list) or not messages:
                hint = 'send {"messages": [{"role": "user", "content": "..."}]}'
                return Response.json({"error": hint}, status=400)
        else:
            question = parse_qs(urlsplit(request.url).query).get("q", ["def fib(n):"])[0]
            messages = [{"role": "user", "content": question}]
        try:
            stream = await self.env.AI.run(MODEL, {"messages": messages, "max_tokens": 64, "stream": True})
        except AIError as exc:
            return Response.json({"error": str(exc)}, status=400 if exc.code in (5004, 5007) else 503)
        return Response(stream, headers={"content-type": "text/event-stream"})
""".replace("@MODEL@", MODEL)

FASTAPI = '''\
"""FastAPI on Workers, as Cloudflare runs it: `asgi.fetch(app, request, env)` hands the request to
the ASGI app, with the bindings in `request.scope["env"]`. FastAPI comes from pyproject.toml's
dependencies; where it is missing, every request gets a 501 that says so."""

import asgi  # Cloudflare's ASGI bridge for Python Workers
from workers import Response, WorkerEntrypoint

try:
    from fastapi import FastAPI, Request
except ImportError as exc:
    FastAPI, MISSING = None, exc.name
else:
    MISSING = None

if FastAPI is not None:
    app = FastAPI()

    @app.get("/")
    async def root():
        return {"message": "Hello, World!"}

    @app.get("/items/{item_id}")
    async def read_item(item_id: int):
        return {"item_id": item_id}

    @app.get("/env")
    async def greeting(req: Request):  # the worker's env (vars, bindings) is in the request's scope
        return {"greeting": req.scope["env"].GREETING}


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        if MISSING is not None:
            return Response(
                f"this worker needs the {MISSING!r} module: list it in pyproject.toml's dependencies "
                "(edge dev installs them into .edge/python/)\\n",
                status=501,
            )
        return await asgi.fetch(app, request, self.env)
'''

FASTAPI_PYPROJECT = """\
[project]
name = "{name}"
version = "0.1.0"
requires-python = ">=3.11"
dependencies = ["fastapi"]
"""

D1 = '''\
"""A D1 database behind a worker: GET / returns a random quote, POST / {"quote": ..., "author": ...}
adds one. The database is the D1 binding env.DB (d1_databases in wrangler.jsonc)."""

from workers import Response, WorkerEntrypoint

SCHEMA = "CREATE TABLE IF NOT EXISTS quotes (id INTEGER PRIMARY KEY, quote TEXT NOT NULL, author TEXT)"


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        if "DB" not in self.env:
            return Response(
                "this worker needs the D1 binding env.DB: declare it in wrangler.jsonc's d1_databases\\n",
                status=501,
            )
        db = self.env.DB
        await db.prepare(SCHEMA).run()
        if request.method == "POST":
            body = await request.json()
            await db.prepare("INSERT INTO quotes (quote, author) VALUES (?, ?)").bind(
                body["quote"], body.get("author")
            ).run()
            return Response.json({"added": body["quote"]}, status=201)
        result = await db.prepare("SELECT quote, author FROM quotes ORDER BY RANDOM() LIMIT 1").all()
        rows = result.results
        return Response.json(rows[0] if rows else {"quote": None, "hint": "POST a quote first"})
'''

RAG = """\
\"\"\"Retrieval-augmented answers over your own documents, with Workers AI and Vectorize.

POST /documents {"documents": [{"text": "...", "id": "optional"}, ...]} embeds each text with
EMBEDDING_MODEL and upserts it into the Vectorize index env.VECTORIZE (its text in the metadata);
GET /?q=question (or POST / {"question": "..."}) embeds the question, takes the TOP_K nearest
passages and asks CHAT_MODEL with them in its prompt. The answer carries the matches and the
prompt it was given, so you can see what the model read.\"\"\"

import hashlib
from urllib.parse import parse_qs, urlsplit

from workers import AIError, Response, WorkerEntrypoint

EMBEDDING_MODEL = "@cf/baai/bge-base-en-v1.5"  # 768 dimensions: the index must have as many
CHAT_MODEL = "@MODEL@"
TOP_K = 3
TEXT_CHARS = 4000  # of each passage kept in its metadata (Vectorize holds 10 KiB of it)
MAX_DOCUMENTS = 100  # per POST: what one embedding call takes


def passage_id(text):
    return hashlib.sha256(text.encode()).hexdigest()[:32]


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        missing = [name for name in ("AI", "VECTORIZE") if name not in self.env]
        if missing:
            needs = f"this worker needs the bindings {missing} (wrangler.jsonc: ai, vectorize)\\n"
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
        return Response("not found\\n", status=404)

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
        context = "\\n\\n".join(f"[{i + 1}] {text}" for i, text in enumerate(passages))
        system = (
            "Answer the question from these passages only; if they do not hold the answer, say so."
            "\\n\\n" + (context or "(no passages: POST some to /documents first)")
        )
        messages = [{"role": "system", "content": system}, {"role": "user", "content": question}]
        chat = await self.env.AI.run(CHAT_MODEL, {"messages": messages, "max_tokens": max_tokens})
        choices = chat.get("choices")
        text = choices[0]["message"]["content"] if choices else chat.get("response")
        matches = [{"id": m.id, "score": m.score, "text": m.metadata["text"]} for m in found.matches]
        return Response.json({"answer": text, "matches": matches, "prompt": messages})
""".replace("@MODEL@", MODEL)

TEMPLATES: dict[str, Template] = {
    "hello": Template(
        "a plain fetch handler",
        HELLO,
        "Try it: `curl http://127.0.0.1:8787/` answers `Hello World!`.",
    ),
    "ai-chat": Template(
        "a chat endpoint that streams env.AI.run's answer",
        AI_CHAT,
        "Try it (the model runs on the simulated GPU PoPs):\n\n"
        "    curl -N 'http://127.0.0.1:8787/?q=def+fib(n):'\n"
        '    curl -N http://127.0.0.1:8787/ -d \'{"messages": [{"role": "user", "content": "import os"}]}\'',
        {"ai": {"binding": "AI"}},
    ),
    "fastapi": Template(
        "FastAPI through Cloudflare's asgi bridge",
        FASTAPI,
        "This worker is FastAPI through Cloudflare's `asgi` bridge; the same worker.py runs on "
        "Cloudflare. `edge dev` installs pyproject.toml's dependencies (FastAPI) into "
        "`.edge/python/` at its first start (delete that folder to reinstall them).\n\n"
        "    curl http://127.0.0.1:8787/items/7",
        {"vars": {"GREETING": "hello from FastAPI"}},
        extra_files={"pyproject.toml": FASTAPI_PYPROJECT},
    ),
    "d1": Template(
        "a D1 database of quotes (env.DB)",
        D1,
        "This worker keeps quotes in the D1 database bound as `env.DB` (its data lives in .edge/):\n\n"
        '    curl http://127.0.0.1:8787/ -d \'{"quote": "Simple is better than complex."}\'\n'
        "    curl http://127.0.0.1:8787/\n\n"
        "`edge d1 execute DB --command 'SELECT * FROM quotes'` reads it from the shell.",
        {
            "d1_databases": [
                {
                    "binding": "DB",
                    "database_name": "{name}-db",
                    "database_id": "00000000-0000-0000-0000-000000000000",
                }
            ]
        },
    ),
    "rag": Template(
        "retrieval-augmented answers: embeddings, a Vectorize index (env.VECTORIZE) and the chat model",
        RAG,
        "First make its Vectorize index, 768 dimensions for the embedding model it calls "
        "(kept in .edge/):\n\n"
        "    edge vectorize create docs --preset @cf/baai/bge-base-en-v1.5\n\n"
        "Then give it documents and ask:\n\n"
        "    curl http://127.0.0.1:8787/documents \\\n"
        '      -d \'{"documents": [{"text": "The office cat is called Miso."}]}\'\n'
        "    curl 'http://127.0.0.1:8787/?q=What+is+the+office+cat+called'\n\n"
        "The answer shows the passages found and the prompt the model read. The embeddings come from a "
        "deterministic stand-in at BGE's width (`served_by` says so): lexical, so ask with the "
        "documents' words.",
        {"ai": {"binding": "AI"}, "vectorize": [{"binding": "VECTORIZE", "index_name": "docs"}]},
    ),
}


class InitError(Exception):
    """The project cannot be written as asked; the message says what to change."""


def worker_name(folder: Path) -> str:
    """A Workers script name from the folder's: lowercase letters, digits and dashes."""
    name = re.sub(r"[^a-z0-9-]+", "-", folder.name.lower()).strip("-")
    return name[:63] or "worker"


def _fill(value: Any, name: str) -> Any:
    if isinstance(value, str):
        return value.replace("{name}", name)
    if isinstance(value, list):
        return [_fill(v, name) for v in value]
    if isinstance(value, dict):
        return {k: _fill(v, name) for k, v in value.items()}
    return value


def wrangler_jsonc(name: str, template: Template, today: date) -> str:
    config = {
        "name": name,
        "main": "worker.py",
        "compatibility_date": today.isoformat(),
        "compatibility_flags": ["python_workers"],
        **_fill(template.config, name),
    }
    return (
        "// wrangler's own config file: the same keys run this worker on Cloudflare (`wrangler dev`)\n"
        '// and here (`edge dev`). edge\'s own settings, if any, go under "edge".\n'
        + json.dumps(config, indent=2)
        + "\n"
    )


def readme(name: str, template_name: str, template: Template) -> str:
    return (
        f"# {name}\n\n"
        f"A Workers project ({template_name}: {template.description}), made by `edge init`.\n\n"
        "## Run it\n\n"
        "    edge dev          # serves worker.py on http://127.0.0.1:8787, reloading on changes\n"
        "    edge tail         # its requests, logs and exceptions, live (in another terminal)\n\n"
        f"{template.readme}\n\n"
        "## Files\n\n"
        "- `worker.py`: the worker (Cloudflare Python Workers' API, from the `workers` package)\n"
        "- `wrangler.jsonc`: its config, in wrangler's keys\n"
        "- `.edge/`: the runtime's local state (database, tokens); never commit it\n"
    )


def write_project(folder: Path, template_name: str = "hello", today: date | None = None) -> list[Path]:
    """Write a new project into `folder` (which must not exist, or be empty); returns the files."""
    template = TEMPLATES.get(template_name)
    if template is None:
        raise InitError(f"no template {template_name!r}; choose one of {', '.join(TEMPLATES)}")
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise InitError(f"{folder} already exists and is not an empty folder; pick a new name")
    name = worker_name(folder.resolve())
    files = {
        "worker.py": template.worker,
        "wrangler.jsonc": wrangler_jsonc(name, template, today or date.today()),
        "README.md": readme(name, template_name, template),
        ".gitignore": ".edge/\n__pycache__/\n",
        **{rel: _fill(text, name) for rel, text in template.extra_files.items()},
    }
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for rel, text in files.items():
        path = folder / rel
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
