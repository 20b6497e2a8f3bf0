"""`edge init NAME --template T`: a new project folder that `edge dev` serves at once.

Each template writes worker.py (in Cloudflare Python Workers' own shapes, so the same file runs
there), wrangler.jsonc (wrangler's keys), README.md and a .gitignore for the runtime's state.
`fastapi` runs FastAPI through Cloudflare's `asgi` bridge; its pyproject.toml lists fastapi, which
`edge dev` installs (runtime.host.deps); without it the worker answers 501 saying so. `d1` uses the
D1 binding `env.DB` (wrangler.jsonc's d1_databases) and answers 501 naming it if it is missing.
`rag` embeds documents into a Vectorize index (env.VECTORIZE) and answers questions with the
chat model, the passages found in its prompt. `agent` runs a tool loop: the model calls a tool the
worker implements, the worker runs it and sends the result back, the model answers from it.
`ai-search` (docs-bot) answers from the Markdown files of its docs/ folder through an AI Search
binding (env.DOCS) whose instance `edge dev` fills from that folder (its `source_dir`).
Each project gets tests/test_worker.py, tests of its worker with edge-workers' pytest plugin
(runtime.testing), which `python -m pytest` runs there.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path
from typing import Any

MODEL = "@edge/moonshotai/kimi-k2-mini"
# the rag and agent templates' model: of the two miniatures, the one that reads passages and calls
# tools best (BENCHMARKS.md, "Miniatures that chat")
READER = "@edge/zai-org/glm-4.5-mini"


@dataclass(frozen=True)
class Template:
    description: str
    worker: str
    readme: str  # the template's own part of README.md
    config: dict[str, Any] = field(default_factory=dict)  # keys beyond name, main and the dates
    extra_files: dict[str, str] = field(default_factory=dict)
    test: str = ""  # tests/test_worker.py: pytest with edge-workers' plugin (runtime.testing)


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

# this name streams Workers AI's text-generation events, data: {"response": "..."}; a chat-completions
# name (@edge/zai-org/glm-4.5-mini, @cf/moonshotai/kimi-k2.6) streams chat.completion.chunk events
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
            question = parse_qs(urlsplit(request.url).query).get("q", ["What is the capital of France?"])[0]
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
adds one, GET /explain asks the model what a quote means. The database is the D1 binding env.DB
(d1_databases in wrangler.jsonc); a cron trigger (triggers.crons) counts the quotes each night into
its `daily_counts` table."""

from workers import AIError, Response, WorkerEntrypoint

# this name answers Workers AI's text-generation shape, {"response": ..., "usage": ...}
MODEL = "@MODEL@"
SCHEMA = [
    "CREATE TABLE IF NOT EXISTS quotes (id INTEGER PRIMARY KEY, quote TEXT NOT NULL, author TEXT)",
    "CREATE TABLE IF NOT EXISTS daily_counts (day TEXT PRIMARY KEY, quotes INTEGER NOT NULL)",
]


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        if "DB" not in self.env:
            return Response(
                "this worker needs the D1 binding env.DB: declare it in wrangler.jsonc's d1_databases\\n",
                status=501,
            )
        db = self.env.DB
        if request.method == "POST":  # the body is checked before the database is touched
            try:
                body = await request.json()
            except ValueError:
                body = None
            quote = body.get("quote") if isinstance(body, dict) else None
            if not isinstance(quote, str) or not quote.strip():
                hint = 'the field "quote" (a string) is missing: send {"quote": "...", "author": "..."}'
                return Response.json({"error": hint}, status=400)
        for statement in SCHEMA:
            await db.prepare(statement).run()
        if request.method == "POST":
            await db.prepare("INSERT INTO quotes (quote, author) VALUES (?, ?)").bind(
                quote, body.get("author")
            ).run()
            return Response.json({"added": quote}, status=201)
        result = await db.prepare("SELECT quote, author FROM quotes ORDER BY RANDOM() LIMIT 1").all()
        rows = result.results
        if not rows:
            return Response.json({"quote": None, "hint": "POST a quote first"})
        if request.url.split("?")[0].endswith("/explain"):
            question = f"What does this quote mean? {rows[0]['quote']}"
            try:
                answer = await self.env.AI.run(
                    MODEL, {"messages": [{"role": "user", "content": question}], "max_tokens": 32}
                )
            except AIError as exc:
                return Response.json({"error": str(exc)}, status=503)
            return Response.json({"quote": rows[0]["quote"], "explanation": answer["response"]})
        return Response.json(rows[0])

    async def scheduled(self, controller, env, ctx):
        db = self.env.DB
        for statement in SCHEMA:
            await db.prepare(statement).run()
        await db.prepare(
            "INSERT OR REPLACE INTO daily_counts (day, quotes) "
            "SELECT date(?1 / 1000, 'unixepoch'), COUNT(*) FROM quotes"
        ).bind(controller.scheduledTime).run()
'''.replace("@MODEL@", MODEL)

# The rag template's worker is examples/rag/worker.py itself, one file that both the example and
# `edge init --template rag` use, so the two cannot differ: a checkout reads it where it stands, and
# a wheel installs it as runtime/cli/rag_example/worker.py (setup.py), as it installs models/.
_RAG_INSTALLED = Path(__file__).resolve().parent / "rag_example" / "worker.py"
_RAG_CHECKOUT = Path(__file__).resolve().parents[2] / "examples" / "rag" / "worker.py"
RAG_WORKER = _RAG_INSTALLED if _RAG_INSTALLED.is_file() else _RAG_CHECKOUT
RAG = RAG_WORKER.read_text()

AGENT = r'''"""An agent: the model calls the tools this worker implements, the worker runs them and sends
the results back, and the model answers from them (Workers AI's function calling, the loop of
Cloudflare's examples). GET /?q=What is the weather in Lisbon? (or POST {"question": "..."})
answers with the model's reply, each call it made and what the tool returned."""

import hashlib
import json
import math
import re
from urllib.parse import parse_qs, urlsplit

from workers import AIError, Response, WorkerEntrypoint

# this name answers OpenAI's chat.completion shape, {"choices": [...]}; reply_of reads either shape
MODEL = "@READER@"
MAX_ROUNDS = 3  # model calls per question: a model that keeps calling tools is stopped there
TOOLS = [
    {
        "name": "get_weather",
        "description": "The weather in a city now",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "description": "the city's name"}},
            "required": ["city"],
        },
    },
    {
        "name": "calculator",
        "description": "The value of an arithmetic expression: two numbers and + - * or /",
        "parameters": {
            "type": "object",
            "properties": {"expression": {"type": "string", "description": "for example 12 * 7"}},
            "required": ["expression"],
        },
    },
]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "snowy", "foggy"]
ARITHMETIC = re.compile(r"\s*(-?\d+(?:\.\d+)?)\s*([-+*/])\s*(-?\d+(?:\.\d+)?)\s*")


def get_weather(city):
    """A stand-in for a weather API: each city has its own made-up weather, the same every time."""
    digest = hashlib.sha256(str(city).strip().lower().encode()).digest()
    condition = CONDITIONS[digest[1] % len(CONDITIONS)]
    return {"city": city, "temperature_c": digest[0] % 36 - 5, "condition": condition}


def calculator(expression):
    """Two numbers and one operator; anything else is refused (never evaluated as code)."""
    match = ARITHMETIC.fullmatch(expression) if len(expression) <= 64 else None
    if match is None:
        return {"error": "give two numbers and one of + - * /, as in 12 * 7"}
    a, op, b = float(match[1]), match[2], float(match[3])
    if op == "/" and b == 0:
        return {"error": "division by zero"}
    value = a + b if op == "+" else a - b if op == "-" else a * b if op == "*" else a / b
    if not math.isfinite(value):
        return {"error": "the result is too large"}
    return {"result": int(value) if value == int(value) else round(value, 6)}


IMPLEMENTED = {"get_weather": get_weather, "calculator": calculator}


def run_tool(name, arguments):
    tool = IMPLEMENTED.get(name)
    if tool is None or not isinstance(arguments, dict):
        return {"error": f"no tool {name!r} takes these arguments"}
    try:
        return tool(**arguments)
    except TypeError as exc:  # an argument the function does not take
        return {"error": str(exc)}


def reply_of(answer):
    """(text, calls) from either answer shape: Workers AI text generation ({"response", "tool_calls":
    [{"id", "name", "arguments": {...}}]}) or chat completions ({"choices": [...]})."""
    choices = answer.get("choices")
    if not choices:
        calls = [
            {"id": c.get("id") or f"call_{i}", "name": c["name"], "arguments": c["arguments"]}
            for i, c in enumerate(answer.get("tool_calls") or [])
        ]
        return answer.get("response"), calls
    message = choices[0]["message"]
    calls = []
    for c in message.get("tool_calls") or []:
        arguments = c["function"]["arguments"]
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            pass  # kept as written: run_tool refuses it
        calls.append({"id": c["id"], "name": c["function"]["name"], "arguments": arguments})
    return message.get("content"), calls


def as_openai(call):
    """A call as the assistant turn sends it back (OpenAI's shape, which both models take)."""
    arguments = call["arguments"]
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call["id"], "type": "function", "function": {"name": call["name"], "arguments": text}}


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlsplit(request.url)
        if url.path != "/":
            return Response("not found\n", status=404)
        if request.method == "POST":
            try:
                body = await request.json()
            except ValueError:
                body = None
            question = body.get("question") if isinstance(body, dict) else None
        else:
            question = parse_qs(url.query).get("q", [None])[0]
        if not isinstance(question, str) or not question.strip():
            return Response.json({"error": 'ask with ?q=... or POST {"question": "..."}'}, status=400)
        try:
            return Response.json(await self.answer(question))
        except AIError as exc:
            return Response.json({"error": str(exc)}, status=400 if exc.code in (5004, 5006, 5007) else 503)

    async def answer(self, question):
        messages = [{"role": "user", "content": question}]
        made = []
        for _ in range(MAX_ROUNDS - 1):
            inputs = {"messages": messages, "tools": TOOLS, "max_tokens": 96}
            text, calls = reply_of(await self.env.AI.run(MODEL, inputs))
            if not calls:
                return {"answer": text, "tool_calls": made}
            messages.append(
                {"role": "assistant", "content": None, "tool_calls": [as_openai(c) for c in calls]}
            )
            for call in calls:
                result = run_tool(call["name"], call["arguments"])
                made.append({"name": call["name"], "arguments": call["arguments"], "result": result})
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": json.dumps(result)})
        # still calling tools: the last round answers in words
        inputs = {"messages": messages, "tools": TOOLS, "tool_choice": "none", "max_tokens": 96}
        text, _ = reply_of(await self.env.AI.run(MODEL, inputs))
        return {"answer": text, "tool_calls": made}
'''.replace("@READER@", READER)

TEST_HEAD = '''"""The worker's tests: `python -m pytest` in the project's folder, with the Python that
edge-workers is installed in (its pytest plugin gives each test a `worker`: worker.py in its own
isolate, as `edge dev` runs it, with fresh bindings for each test and the real model behind env.AI).
"""
'''

HELLO_TEST = (
    TEST_HEAD
    + """

async def test_it_says_hello(worker):
    r = await worker.fetch("/")
    assert r.status == 200
    assert r.text == "Hello World!"
"""
)

AI_CHAT_TEST = (
    TEST_HEAD
    + '''
import json

QUESTION = {"messages": [{"role": "user", "content": "Hello! Who are you?"}]}


def streamed_text(response):
    """The answer's text, from the server-sent events the worker streams."""
    events = [line[len("data: ") :] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return "".join(json.loads(e).get("response", "") for e in events[:-1])


async def test_the_model_answers_a_question_in_words(worker):
    r = await worker.fetch("/?q=What+is+the+capital+of+France%3F")
    assert r.status == 200
    assert r.headers["content-type"].startswith("text/event-stream")
    assert "Paris" in streamed_text(r)


async def test_the_same_question_gets_the_same_answer(worker):
    # the real model samples; every AI call without a seed of its own gets the plugin's
    # (pytest --edge-ai-seed N, default 0), so an answer repeats
    first = await worker.fetch("/", method="POST", json=QUESTION)
    again = await worker.fetch("/", method="POST", json=QUESTION)
    assert streamed_text(first) == streamed_text(again)


async def test_a_post_without_messages_is_refused(worker):
    r = await worker.fetch("/", method="POST", json={"question": "?"})
    assert r.status == 400
    assert "messages" in r.json()["error"]
'''
)

FASTAPI_TEST = (
    TEST_HEAD
    + """

async def test_fastapi_answers_its_routes(worker):
    # FastAPI comes from pyproject.toml's dependencies, installed at the first run (as edge dev does)
    assert (await worker.fetch("/items/7")).json() == {"item_id": 7}
    assert (await worker.fetch("/env")).json() == {"greeting": "hello from FastAPI"}
"""
)

D1_TEST = (
    TEST_HEAD
    + """
SCHEMA = "CREATE TABLE quotes (id INTEGER PRIMARY KEY, quote TEXT NOT NULL, author TEXT)"


async def test_a_posted_quote_comes_back(worker):
    quote = {"quote": "Simple is better than complex.", "author": "Tim Peters"}
    assert (await worker.fetch("/", method="POST", json=quote)).status == 201
    assert (await worker.fetch("/")).json() == quote


async def test_the_worker_reads_a_seeded_database(worker):
    db = worker.d1("DB")  # env.DB, as the worker sees it; each test starts with an empty one
    await db.exec(SCHEMA)
    await db.prepare("INSERT INTO quotes (quote, author) VALUES (?, ?)").bind("Seeded.", "pytest").run()
    assert (await worker.fetch("/")).json() == {"quote": "Seeded.", "author": "pytest"}


async def test_the_nightly_cron_counts_the_quotes(worker):
    db = worker.d1("DB")
    await db.exec(SCHEMA)
    await db.prepare("INSERT INTO quotes (quote) VALUES (?), (?)").bind("One.", "Two.").run()
    assert (await worker.scheduled("0 3 * * *")).outcome == "ok"
    counts = await db.prepare("SELECT quotes FROM daily_counts").all()
    assert [row["quotes"] for row in counts.results] == [2]


async def test_the_model_explains_a_quote_the_same_way_twice(worker):
    # the real model samples; every AI call without a seed of its own gets the plugin's
    # (pytest --edge-ai-seed N, default 0), so the same question gets the same answer
    db = worker.d1("DB")
    await db.exec(SCHEMA)
    await db.prepare("INSERT INTO quotes (quote) VALUES (?)").bind("Readability counts.").run()
    first = await worker.fetch("/explain")
    assert first.status == 200
    assert first.json()["explanation"]
    assert (await worker.fetch("/explain")).json() == first.json()


async def test_an_empty_database_says_to_post_first(worker):
    assert (await worker.fetch("/")).json()["quote"] is None


async def test_a_post_without_a_quote_is_refused_naming_the_field(worker):
    r = await worker.fetch("/", method="POST", json={"author": "nobody"})
    assert r.status == 400 and 'the field "quote"' in r.json()["error"]
"""
)

RAG_TEST = (
    TEST_HEAD
    + """
DOCUMENTS = [
    {"text": "Lena runs a bakery in Lisbon that opens at 7 am."},
    {"text": "Oscar runs a bookshop in Madrid that opens at 9 am."},
    {"text": "Julia runs a cafe in Berlin that opens at 8 am."},
]
QUESTION = "/?q=In+which+city+is+Lena%27s+bakery%3F&max_tokens=24"


async def test_it_answers_from_the_documents_given(worker):
    # each test starts with no index: make it as `edge vectorize create docs --preset ...` does
    await worker.create_vectorize_index("VECTORIZE", preset="@cf/baai/bge-base-en-v1.5")
    assert (await worker.fetch("/documents", method="POST", json={"documents": DOCUMENTS})).status == 201
    first = await worker.fetch(QUESTION)
    assert first.status == 200
    assert first.json()["matches"][0]["text"] == "Lena runs a bakery in Lisbon that opens at 7 am."
    assert "Lisbon" in first.json()["answer"]
    # the real model samples; every AI call without a seed of its own gets the plugin's
    # (pytest --edge-ai-seed N, default 0), so the same question gets the same answer
    again = await worker.fetch(QUESTION)
    assert again.json()["answer"] == first.json()["answer"]


async def test_a_question_is_needed(worker):
    assert (await worker.fetch("/")).status == 400
"""
)

AGENT_TEST = (
    TEST_HEAD
    + """

async def test_the_model_calls_the_weather_tool_and_answers_from_its_result(worker):
    r = await worker.fetch("/?q=What%27s+the+weather+in+Lisbon%3F")
    assert r.status == 200
    body = r.json()
    (call,) = body["tool_calls"]
    assert (call["name"], call["arguments"]) == ("get_weather", {"city": "Lisbon"})
    assert call["result"]["condition"] in body["answer"]


async def test_a_question_is_needed(worker):
    r = await worker.fetch("/", method="POST", json={"q": "?"})
    assert r.status == 400
    assert "question" in r.json()["error"]
"""
)

# The ai-search template ("docs-bot"): a worker that answers from the Markdown files in docs/,
# through an [[ai_search]] binding whose instance edge dev fills from that folder (source_dir, edge's
# own key) and keeps in step with it as files change.
DOCS_BOT = r'''"""A docs bot: answers questions from the Markdown files in docs/ through AI Search (the
[[ai_search]] binding env.DOCS, whose instance `edge dev` fills from that folder and keeps in step
with it). GET /?q=How many backups does Skylark keep? answers in words, naming the files it read
and quoting the passage found first (a small model's words can stray; the docs' own cannot);
GET /search?q=... shows the passages found (retrieval only); GET /stats says how far the indexing is.
"""

from urllib.parse import parse_qs, urlsplit

from workers import Response, WorkerEntrypoint

MODEL = "@READER@"  # the model that answers; the instance's own default when left out
SOURCES = 3  # passages given to the model, and shown by /search


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        url = urlsplit(request.url)
        if url.path == "/stats":
            try:
                return Response.json(await self.env.DOCS.stats())
            except Exception as exc:  # no instance yet: edge dev makes it from docs/ as it starts
                return Response.json({"error": str(exc)}, status=503)
        question = parse_qs(url.query).get("q", [""])[0].strip()
        if request.method == "POST":
            try:
                body = await request.json()
            except ValueError:
                body = None
            question = str(body.get("question") or "").strip() if isinstance(body, dict) else ""
        if not question:
            hint = 'ask with ?q=... or POST {"question": "..."}'
            return Response.json({"error": hint}, status=400)
        retrieval = {"retrieval": {"max_num_results": SOURCES}}
        try:
            if url.path == "/search":
                found = await self.env.DOCS.search({"query": question, "ai_search_options": retrieval})
                results = [
                    {"file": c["item"]["key"], "score": round(c["score"], 4), "text": c["text"]}
                    for c in found["chunks"]
                ]
                return Response.json({"query": found["search_query"], "results": results})
            answer = await self.env.DOCS.chatCompletions(
                {
                    "messages": [{"role": "user", "content": question}],
                    "model": MODEL,
                    "max_tokens": 48,
                    "ai_search_options": retrieval,
                }
            )
        except Exception as exc:  # AI Search's error: its message names the code and what to change
            return Response.json({"error": str(exc)}, status=502)
        chunks = answer["chunks"]
        return Response.json(
            {
                "answer": answer["choices"][0]["message"]["content"],
                "quote": {"file": chunks[0]["item"]["key"], "text": chunks[0]["text"]} if chunks else None,
                "sources": [c["item"]["key"] for c in chunks],
            }
        )
'''.replace("@READER@", READER)

DOCS_BOT_PAGES = {
    "docs/getting-started.md": """\
# Getting started with Skylark

Skylark is a small self-hosted notes server.

## Install

Install it with `pip install skylark-notes`, then start the server with `skylark serve`.

## The port

By default Skylark listens on port 4040. Set the `SKYLARK_PORT` environment variable to listen
on another port, for example `SKYLARK_PORT=8080 skylark serve`.
""",
    "docs/backups.md": """\
# Backups

Skylark writes a backup of every notebook every six hours into the `backups/` folder.

## How many backups are kept

Skylark keeps the 14 newest backups and deletes older ones. Change the number with
`backup_keep` in `skylark.toml`.

## Restoring a backup

Stop the server, then run `skylark restore backups/FILE.tar` and start it again.
""",
    "docs/accounts.md": """\
# Accounts and passwords

Every person who writes notes has an account, made with `skylark add-user NAME`.

## Resetting a password

An administrator resets a user's password with `skylark reset-password NAME`; the user gets a
one-time link that expires after 24 hours.

## Removing an account

`skylark remove-user NAME` deletes the account; its notes move to the administrator.
""",
}

DOCS_BOT_TEST = (
    TEST_HEAD
    + '''
import asyncio


async def indexed(worker):
    """Until every file of docs/ is indexed (edge dev reads the folder at start, then indexes it)."""
    for _ in range(600):
        r = await worker.fetch("/stats")
        stats = r.json()
        if r.status == 200 and stats["completed"] >= 3 and stats["queued"] + stats["running"] == 0:
            return stats
        await asyncio.sleep(0.05)
    raise AssertionError(f"docs/ was not indexed: {stats}")


async def test_every_file_of_docs_is_indexed(worker):
    stats = await indexed(worker)
    assert stats["completed"] == 3 and stats["error"] == 0


async def test_the_passage_that_answers_comes_first(worker):
    await indexed(worker)
    r = await worker.fetch("/search?q=Which+port+does+Skylark+listen+on+by+default%3F")
    assert r.status == 200
    best = r.json()["results"][0]
    assert best["file"] == "getting-started.md" and "4040" in best["text"]


async def test_it_answers_from_the_file_that_says(worker):
    await indexed(worker)
    r = await worker.fetch("/?q=How+many+backups+does+Skylark+keep%3F")
    assert r.status == 200
    body = r.json()
    assert body["sources"][0] == "backups.md"
    assert body["quote"]["file"] == "backups.md" and "14 newest backups" in body["quote"]["text"]
    assert body["answer"].strip()  # the model's words, read from the passages above
    # the real model samples; every AI call without a seed of its own gets the plugin's
    # (pytest --edge-ai-seed N, default 0), so the same question gets the same answer
    assert (await worker.fetch("/?q=How+many+backups+does+Skylark+keep%3F")).json() == body


async def test_a_question_is_needed(worker):
    r = await worker.fetch("/", method="POST", json={"q": "?"})
    assert r.status == 400
    assert "question" in r.json()["error"]
'''
)

TEMPLATES: dict[str, Template] = {
    "hello": Template(
        "a plain fetch handler",
        HELLO,
        "Try it: `curl http://127.0.0.1:8787/` answers `Hello World!`.",
        test=HELLO_TEST,
    ),
    "ai-chat": Template(
        "a chat endpoint that streams env.AI.run's answer",
        AI_CHAT,
        "Try it (the model runs on the simulated GPU PoPs):\n\n"
        "    curl -N 'http://127.0.0.1:8787/?q=What+is+the+capital+of+France%3F'\n"
        "    curl -N http://127.0.0.1:8787/ "
        '-d \'{"messages": [{"role": "user", "content": "Hello! Who are you?"}]}\'',
        {"ai": {"binding": "AI"}},
        test=AI_CHAT_TEST,
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
        test=FASTAPI_TEST,
    ),
    "d1": Template(
        "a D1 database of quotes (env.DB), a nightly cron and the model explaining a quote",
        D1,
        "This worker keeps quotes in the D1 database bound as `env.DB` (its data lives in .edge/):\n\n"
        '    curl http://127.0.0.1:8787/ -d \'{"quote": "Simple is better than complex."}\'\n'
        "    curl http://127.0.0.1:8787/\n\n"
        "`edge d1 execute DB --command 'SELECT * FROM quotes'` reads it from the shell. "
        "`curl http://127.0.0.1:8787/explain` asks the model about a quote; the cron trigger "
        "(`0 3 * * *`, or `curl http://127.0.0.1:8787/cdn-cgi/handler/scheduled` now) counts the quotes "
        "into `daily_counts`.",
        {
            "ai": {"binding": "AI"},
            "d1_databases": [
                {
                    "binding": "DB",
                    "database_name": "{name}-db",
                    "database_id": "00000000-0000-0000-0000-000000000000",
                }
            ],
            "triggers": {"crons": ["0 3 * * *"]},
        },
        test=D1_TEST,
    ),
    "rag": Template(
        "retrieval-augmented answers: embeddings, a Vectorize index (env.VECTORIZE) and the chat model",
        RAG,
        "First make its Vectorize index, 768 dimensions for the embedding model it calls "
        "(kept in .edge/):\n\n"
        "    edge vectorize create docs --preset @cf/baai/bge-base-en-v1.5\n\n"
        "Then give it documents and ask:\n\n"
        '    curl http://127.0.0.1:8787/documents -d \'{"documents": [\n'
        '      {"text": "Lena runs a bakery in Lisbon that opens at 7 am."},\n'
        '      {"text": "Oscar runs a bookshop in Madrid that opens at 9 am."}]}\'\n'
        "    curl 'http://127.0.0.1:8787/?q=In+which+city+is+Lena%27s+bakery%3F'\n\n"
        "The answer shows the passages found and the prompt the model read. The embeddings come from a "
        "deterministic stand-in at BGE's width (`served_by` says so): lexical, so ask with the "
        "documents' words. The chat model is the GLM-4.5 miniature, the better reader of the two; "
        "it was trained on short passages like these, and it still picks the wrong one at times (its "
        'held-out rates are in edge-workers\' BENCHMARKS.md, "Miniatures that chat").',
        {"ai": {"binding": "AI"}, "vectorize": [{"binding": "VECTORIZE", "index_name": "docs"}]},
        test=RAG_TEST,
    ),
    "agent": Template(
        "an agent: the model calls tools the worker implements and answers from their results",
        AGENT,
        "Ask it something a tool answers (the model calls `get_weather` or `calculator`, the worker "
        "runs the function and sends the result back, and the model answers from it):\n\n"
        "    curl 'http://127.0.0.1:8787/?q=What%27s+the+weather+in+Lisbon%3F'\n"
        '    curl http://127.0.0.1:8787/ -d \'{"question": "Do I need an umbrella in Oslo today?"}\'\n\n'
        "The answer lists each call, its arguments and what the tool returned. Add a tool: declare it "
        "in `TOOLS` and implement it in `IMPLEMENTED`. The model is the GLM-4.5 miniature, the better "
        "caller of the two: it copies a city from the question, but it often gets a calculator's "
        "numbers wrong (the calculator refuses what is not two numbers and an operator, and the model "
        "answers from what came back); its rates are in edge-workers' BENCHMARKS.md, \"Miniatures that "
        'chat".',
        {"ai": {"binding": "AI"}},
        test=AGENT_TEST,
    ),
    "ai-search": Template(
        "a docs bot: AI Search over the Markdown files in docs/ (env.DOCS), answered by the chat model",
        DOCS_BOT,
        "`edge dev` indexes the Markdown files in `docs/` into the AI Search instance `docs` (the "
        "`ai_search` binding's `source_dir`, edge's own key; Cloudflare fills an instance from an R2 "
        "bucket or uploads instead) and keeps it in step as files change. Ask it what the docs say:\n\n"
        "    curl 'http://127.0.0.1:8787/?q=Which+port+does+Skylark+listen+on+by+default%3F'\n"
        "    curl 'http://127.0.0.1:8787/?q=How+many+backups+does+Skylark+keep%3F'\n"
        '    curl http://127.0.0.1:8787/ -d \'{"question": "How do I reset a password?"}\'\n'
        "    curl 'http://127.0.0.1:8787/search?q=restore+a+backup'     # the passages only\n"
        "    curl http://127.0.0.1:8787/stats                            # the indexing's progress\n\n"
        "Each answer names the files it read (`sources`). Put your own Markdown in `docs/` (the "
        "instance follows within seconds); `edge ai-search search docs --query '...'` searches it from "
        "the shell, `edge ai-search stats docs` says how far indexing is. The answering model is the "
        "GLM-4.5 miniature, the better reader of the two; it was trained on short passages, and it "
        "still picks the wrong one at times (its held-out rates are in edge-workers' BENCHMARKS.md, "
        '"Miniatures that chat").',
        {
            "ai_search": [{"binding": "DOCS", "instance_name": "docs", "source_dir": "docs/"}],
            # edge's own: the GPU PoP and the model that answer (a worker without env.AI gets none)
            "edge": {"pops": ["ICN"], "models": [READER]},
        },
        extra_files=DOCS_BOT_PAGES,
        test=DOCS_BOT_TEST,
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
        "- `tests/test_worker.py`: its tests (`python -m pytest`, with edge-workers' pytest plugin)\n"
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
        **({"tests/test_worker.py": template.test} if template.test else {}),
    }
    folder.mkdir(parents=True, exist_ok=True)
    written = []
    for rel, text in files.items():
        path = folder / rel
        path.parent.mkdir(exist_ok=True)
        path.write_text(text, encoding="utf-8")
        written.append(path)
    return written
