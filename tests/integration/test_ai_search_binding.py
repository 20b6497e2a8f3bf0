"""AI Search's Workers bindings through a real `edge dev`: a Python worker written as Cloudflare's
examples are drives every method of a namespace binding ([[ai_search_namespaces]]), an instance
binding ([[ai_search]]) and the legacy env.AI.autorag(name), and meets each error: an unknown
instance (AiSearchNotFoundError, 7002), another namespace's instance (unreachable), options and
arguments refused; a streamed answer's first event is the chunks; every generation is one of the
request's AI calls (its timing in the response's server-timing, as env.AI.run's)."""

from __future__ import annotations

import json
import textwrap

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

pytestmark = pytest.mark.slow

MODEL = "@edge/zai-org/glm-4.5-mini"  # serves AI Search's default model here too

WORKER = """
import json
from workers import Blob, Response, WorkerEntrypoint
from workers.ai_search import (
    AiSearchError, AiSearchInternalError, AiSearchNotFoundError, AutoRAGNotFoundError,
)

MODEL = "@MODEL@"
CACHING = "# Caching\\n\\nResponses are cached for one hour. Run `edge cache purge` to forget them."
DEPLOYING = "# Deploying\\n\\nRun `edge deploy`; `edge rollback` brings the previous version back."
SUPPORT = "# Support\\n\\nWrite to help@example.com: replies arrive within one business day."


async def parts(text):
    for piece in (text[:10], text[10:]):
        yield piece.encode()


def failure(exc):
    return {"type": type(exc).__name__, "name": getattr(exc, "name", None),
            "code": getattr(exc, "code", None), "message": str(exc)}


async def attempt(awaitable):
    try:
        out = await awaitable
    except (AiSearchError, TypeError, ValueError) as exc:
        return failure(exc)
    return {"ok": out.to_py() if hasattr(out, "to_py") else out}


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path = request.url.split("/", 3)[3].split("?")[0]
        env = self.env
        if path == "setup":
            kb = await env.AI_SEARCH.create({"id": "kb"})
            first = await kb.items.uploadAndPoll("caching.md", CACHING, {"metadata": {"topic": "cache"}})
            second = await kb.items.uploadAndPoll("deploying.md", Blob([DEPLOYING], "text/markdown"))
            third = await kb.items.uploadAndPoll("support.md", parts(SUPPORT), timeoutMs=30000)
            other = await env.AI_SEARCH.create(id="kb2")
            await other.items.uploadAndPoll("support-copy.md", SUPPORT.encode())
            secret = await env.OTHER_NS.create({"id": "secret"})
            await secret.items.uploadAndPoll("secret.md", "# Secret\\n\\nThe vault code is 4711.")
            docs = await env.DEFAULT_NS.create({"id": "docs"})
            queued = await env.DOCS.items.upload("caching.md", CACHING)
            await env.DOCS.items.uploadAndPoll("support.md", SUPPORT)
            return Response.json({"handle": repr(kb), "statuses": [first.status, second.status, third.status],
                                  "keys": [first.key, second.key, third.key], "queued": queued.status,
                                  "docs": repr(docs)})
        if path == "search":
            found = await env.AI_SEARCH.get("kb").search({
                "messages": [{"role": "user", "content": "How long are responses cached?"}],
                "ai_search_options": {"retrieval": {"max_num_results": 2}},
            })
            by_query = await env.AI_SEARCH.get("kb").search(query="edge rollback previous version")
            return Response.json({"search_query": found.search_query,
                                  "keys": [c.item.key for c in found.chunks],
                                  "first": found.chunks[0].to_py(), "by_query": by_query.chunks[0].item.key})
        if path == "multi":
            found = await env.AI_SEARCH.search({"query": "support reply business day",
                                                "ai_search_options": {"instance_ids": ["kb", "kb2"]}})
            return Response.json({"instances": sorted({c.instance_id for c in found.chunks})})
        if path == "chat":
            answer = await env.AI_SEARCH.get("kb").chatCompletions({
                "messages": [{"role": "user", "content": "How long are responses cached?"}],
                "model": MODEL, "max_tokens": 8,
            })
            return Response.json(answer.to_py())
        if path == "multi-chat":
            answer = await env.AI_SEARCH.chatCompletions(
                messages=[{"role": "user", "content": "When does support reply?"}], model=MODEL, max_tokens=4,
                ai_search_options={"instance_ids": ["kb", "kb2"]})
            return Response.json(answer.to_py())
        if path == "stream":
            stream = await env.DOCS.chatCompletions({
                "messages": [{"role": "user", "content": "When does support reply?"}],
                "model": MODEL, "max_tokens": 6, "stream": True,
            })
            return Response(stream, headers={"content-type": "text/event-stream"})
        if path == "manage":
            kb = env.AI_SEARCH.get("kb")
            listed = await env.AI_SEARCH.list()
            info = await kb.info()
            stats = await kb.stats()
            updated = await kb.update({"max_num_results": 5})
            scratch = await env.AI_SEARCH.create({"id": "scratch"})
            await env.AI_SEARCH.delete("scratch")
            gone = await attempt(scratch.info())
            jobs = await kb.jobs.list()
            return Response.json({"listed": [i.id for i in listed.result],
                                  "total": listed.result_info.total_count, "info": info.to_py(),
                                  "stats": stats.to_py(), "updated": updated.max_num_results,
                                  "gone": gone, "jobs": jobs.to_py()})
        if path == "items":
            kb = env.AI_SEARCH.get("kb")
            listed = await kb.items.list({"page": 1, "per_page": 2})
            every = await kb.items.list()
            caching = next(i for i in every.result if i.key == "caching.md")
            info = await kb.items.get(caching.id).info()
            file = await kb.items.get(caching.id).download()
            body = b"".join([part async for part in file.body])
            chunks = await kb.items.get(caching.id).chunks({"limit": 5})
            added = await kb.items.upload("temp.md", "# Temp\\n\\nto be deleted")
            await kb.items.delete(added.id)
            deleted = await attempt(kb.items.get(added.id).info())
            return Response.json({"page": [i.key for i in listed.result],
                                  "info_page": listed.result_info.to_py(),
                                  "keys": sorted(i.key for i in every.result), "info": info.to_py(),
                                  "file": {"filename": file.filename, "contentType": file.contentType,
                                           "size": file.size, "body": body.decode()},
                                  "chunks": chunks.to_py(), "deleted": deleted})
        if path == "large":  # over what one call from the isolate carries: sent in parts
            kb = env.AI_SEARCH.get("kb")
            text = "".join(f"Line {i}: the quick brown fox jumps over the lazy dog.\\n" for i in range(50000))
            added = await kb.items.upload("large.md", text)
            file = await kb.items.get(added.id).download()
            body = b"".join([part async for part in file.body])
            await kb.items.delete(added.id)
            return Response.json({"sent": len(text), "size": file.size, "same": body == text.encode()})
        if path == "docs":
            found = await env.DOCS.search({"query": "How long are responses cached?"})
            info = await env.DOCS.info()
            listed = await env.DOCS.items.list()
            return Response.json({"keys": [c.item.key for c in found.chunks], "id": info.id,
                                  "namespace": info.namespace, "items": sorted(i.key for i in listed.result)})
        if path == "legacy":
            rag = env.AI.autorag("docs")
            found = await rag.search({"query": "How long are responses cached?", "max_num_results": 2})
            answer = await rag.aiSearch({"query": "When does support reply?", "model": MODEL,
                                         "system_prompt": "Answer in five words."})
            streamed = await rag.aiSearch({"query": "When does support reply?", "model": MODEL,
                                           "stream": True})
            text = await streamed.text()
            missing = await attempt(env.AI.autorag("nope").search({"query": "x"}))
            listed = await env.AI.autorag().list()
            return Response.json({"search": found.to_py(), "answer": answer.to_py(),
                                  "stream": {"type": streamed.headers.get("content-type"), "text": text},
                                  "missing": missing, "listed": [r.id for r in listed]})
        if path == "errors":
            out = {}
            out["unknown"] = await attempt(env.AI_SEARCH.get("nope").search({"query": "x"}))
            out["unknown_info"] = await attempt(env.AI_SEARCH.get("nope").info())
            out["other_ns"] = await attempt(env.AI_SEARCH.get("secret").search({"query": "vault code"}))
            out["other_ns_multi"] = await attempt(env.AI_SEARCH.search(
                {"query": "vault code", "ai_search_options": {"instance_ids": ["kb", "secret"]}}))
            out["bad_option"] = await attempt(env.AI_SEARCH.get("kb").search(
                {"query": "x", "ai_search_options": {"retrieval": {"colour": "blue"}}}))
            out["bad_param"] = await attempt(env.AI_SEARCH.get("kb").search({"query": "x", "colour": 1}))
            out["bad_range"] = await attempt(env.AI_SEARCH.get("kb").search(
                {"query": "x", "ai_search_options": {"retrieval": {"max_num_results": 99}}}))
            out["no_instance_ids"] = await attempt(env.AI_SEARCH.search({"query": "x"}))
            out["instance_ids_on_instance"] = await attempt(env.DOCS.search(
                {"query": "x", "ai_search_options": {"instance_ids": ["kb"]}}))
            out["bad_list_option"] = await attempt(env.AI_SEARCH.get("kb").items.list({"colour": 1}))
            out["not_a_dict"] = await attempt(env.AI_SEARCH.get("kb").search("just a string"))
            out["bad_content"] = await attempt(env.AI_SEARCH.get("kb").items.upload("x.md", 42))
            out["exists"] = await attempt(env.AI_SEARCH.create({"id": "kb"}))
            out["web_crawler"] = await attempt(env.AI_SEARCH.create(
                {"id": "site", "type": "web-crawler", "source": "example.com"}))
            try:
                env.AI_SEARCH.get(5)
            except TypeError as exc:
                out["bad_name"] = failure(exc)
            out["classes"] = [issubclass(AiSearchNotFoundError, AiSearchError),
                              issubclass(AiSearchInternalError, AiSearchError),
                              issubclass(AutoRAGNotFoundError, AiSearchError)]
            return Response.json(out)
        return Response("no such path", status=404)
""".replace("@MODEL@", MODEL)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("ai-search-binding")
    (folder / "worker.py").write_text(textwrap.dedent(WORKER))
    (folder / "wrangler.toml").write_text(
        textwrap.dedent(
            f"""
            name = "ai-search-binding"
            main = "worker.py"
            compatibility_date = "2026-12-02"

            [ai]
            binding = "AI"

            [[ai_search_namespaces]]
            binding = "AI_SEARCH"
            namespace = "my-ns"

            [[ai_search_namespaces]]
            binding = "OTHER_NS"
            namespace = "other-ns"

            [[ai_search_namespaces]]
            binding = "DEFAULT_NS"
            namespace = "default"

            [[ai_search]]
            binding = "DOCS"
            instance_name = "docs"

            [edge]
            pops = ["ICN"]
            models = ["{MODEL}"]
            models_dir = "{REPO / "models"}"
            """
        )
    )
    with DevServer(folder / "wrangler.toml", cwd=folder) as srv:
        r = httpx.get(f"{srv.url}/setup", timeout=300)
        assert r.status_code == 200, r.text + srv.log.read_text()[-3000:]
        srv.setup = r.json()
        yield srv


def get(server, path):
    r = httpx.get(f"{server.url}/{path}", timeout=300)
    assert r.status_code == 200, r.text + server.log.read_text()[-3000:]
    return r


def test_create_gives_a_handle_and_upload_and_poll_indexes_str_blob_and_stream(server):
    setup = server.setup
    assert setup["handle"] == "<AISearchInstance kb>" and setup["docs"] == "<AISearchInstance docs>"
    assert setup["statuses"] == ["completed"] * 3, setup
    assert setup["keys"] == ["caching.md", "deploying.md", "support.md"]
    assert setup["queued"] in ("queued", "running", "completed")  # upload returns before indexing


def test_a_namespace_instance_searches_by_messages_and_by_query(server):
    out = get(server, "search").json()
    assert out["keys"][0] == "caching.md" and len(out["keys"]) <= 2, out
    first = out["first"]
    assert {"id", "type", "score", "text", "item"} <= set(first) and "one hour" in first["text"]
    assert first["item"]["key"] == "caching.md" and 0 < first["score"] <= 1
    assert out["search_query"] and out["by_query"] == "deploying.md"


def test_a_namespace_searches_across_its_instances(server):
    assert get(server, "multi").json()["instances"] == ["kb", "kb2"]


def test_chat_completions_answers_with_its_chunks_and_the_generation_is_the_requests(server):
    r = get(server, "chat")
    out = r.json()
    assert out["object"] == "chat.completion" and out["model"] == MODEL
    assert out["choices"][0]["message"]["role"] == "assistant"
    assert isinstance(out["choices"][0]["message"]["content"], str)
    assert out["chunks"] and out["chunks"][0]["item"]["key"] == "caching.md"
    # the generation ran as an env.AI.run of the request: its timing is in the response's headers
    assert "server-timing" in r.headers and "x-edge-quantization" in r.headers, dict(r.headers)
    multi = get(server, "multi-chat").json()
    assert multi["object"] == "chat.completion" and {c["instance_id"] for c in multi["chunks"]} <= {
        "kb",
        "kb2",
    }


def test_a_streamed_answer_sends_the_chunks_first_then_completion_chunks(server):
    r = get(server, "stream")
    assert r.headers["content-type"].startswith("text/event-stream")
    events = [e for e in r.text.split("\n\n") if e.strip()]
    assert "chunks" in events[0].split("\n")[0], events[:2]  # `event: chunks`, then its data
    chunks = json.loads(events[0].split("data: ", 1)[1])
    chunks = chunks["chunks"] if isinstance(chunks, dict) else chunks
    assert chunks and chunks[0]["item"]["key"] == "support.md"
    assert events[-1] == "data: [DONE]"
    pieces = [json.loads(e.split("data: ", 1)[1]) for e in events[1:-1]]
    assert pieces and all(p["object"] == "chat.completion.chunk" for p in pieces)


def test_list_info_stats_update_delete_and_jobs(server):
    out = get(server, "manage").json()
    assert {"kb", "kb2"} <= set(out["listed"]) and "secret" not in out["listed"]
    assert out["total"] == len(out["listed"])
    assert out["info"]["id"] == "kb" and out["info"]["namespace"] == "my-ns"
    assert out["stats"]["completed"] == 3 and "last_activity" in out["stats"]
    assert out["updated"] == 5
    assert out["gone"]["name"] == "AiSearchNotFoundError" and out["gone"]["code"] == 7002
    assert "result" in out["jobs"] and "result_info" in out["jobs"]


def test_items_list_get_download_chunks_and_delete(server):
    out = get(server, "items").json()
    assert (
        len(out["page"]) == 2 and out["info_page"]["per_page"] == 2 and out["info_page"]["total_count"] == 3
    )
    assert out["keys"] == ["caching.md", "deploying.md", "support.md"]
    assert out["info"]["key"] == "caching.md" and out["info"]["status"] == "completed"
    assert out["info"]["metadata"]["topic"] == "cache"
    assert out["file"]["filename"] == "caching.md" and out["file"]["body"].startswith("# Caching")
    assert out["file"]["size"] == len(out["file"]["body"].encode())
    assert out["file"]["contentType"].startswith("text/")
    assert out["chunks"]["result"] and "one hour" in out["chunks"]["result"][0]["text"]
    assert out["deleted"]["name"] == "AiSearchNotFoundError" and out["deleted"]["code"] == 7002


def test_an_upload_larger_than_one_call_is_sent_in_parts(server):
    out = get(server, "large").json()
    assert out["sent"] > 2 * 2**20 and out["size"] == out["sent"] and out["same"] is True, out


def test_an_instance_binding_reaches_its_instance_of_the_default_namespace(server):
    out = get(server, "docs").json()
    assert out["id"] == "docs" and out["namespace"] == "default"
    assert out["keys"][0] == "caching.md" and out["items"] == ["caching.md", "support.md"]


def test_the_legacy_autorag_binding_searches_and_answers_in_its_own_format(server):
    out = get(server, "legacy").json()
    found = out["search"]
    assert found["object"] == "vector_store.search_results.page" and found["search_query"]
    assert found["data"][0]["filename"] == "caching.md" and found["data"][0]["content"][0]["type"] == "text"
    assert {"file_id", "score", "attributes"} <= set(found["data"][0])
    assert found["has_more"] is False and "next_page" in found
    assert isinstance(out["answer"]["response"], str) and out["answer"]["data"][0]["filename"] == "support.md"
    assert out["stream"]["type"] == "text/event-stream" and out["stream"]["text"].rstrip().endswith("[DONE]")
    assert out["missing"]["name"] == "AutoRAGNotFoundError" and out["missing"]["code"] == 7002
    assert "docs" in out["listed"]


def test_each_error_is_cloudflares(server):
    out = get(server, "errors").json()
    for key in ("unknown", "unknown_info"):
        assert out[key]["name"] == "AiSearchNotFoundError" and out[key]["code"] == 7002, out[key]
        assert out[key]["message"].startswith("7002: ") and "nope" in out[key]["message"]
    # another namespace's instance is not there for this binding
    assert out["other_ns"]["name"] == "AiSearchNotFoundError", out["other_ns"]
    assert out["other_ns_multi"]["name"] == "AiSearchNotFoundError", out["other_ns_multi"]
    for key in ("bad_option", "bad_param", "bad_range"):
        assert out[key]["name"] == "AiSearchInternalError" and out[key]["code"] == 7001, (key, out[key])
    assert "colour" in out["bad_option"]["message"] and "colour" in out["bad_param"]["message"]
    for key in (
        "no_instance_ids",
        "instance_ids_on_instance",
        "bad_list_option",
        "not_a_dict",
        "bad_content",
    ):
        assert out[key]["type"] == "TypeError", (key, out[key])
    assert "instance_ids" in out["no_instance_ids"]["message"]
    assert out["exists"]["code"] == 7003 and out["web_crawler"]["code"] == 7006
    assert out["bad_name"]["type"] == "TypeError"
    assert out["classes"] == [True, True, True]
