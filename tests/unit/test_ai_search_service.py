"""AI Search's service (runtime.ai.search.service): namespaces, instances, items, indexing,
retrieval with each of Cloudflare's options, sources (R2, a folder), jobs, answers, the legacy
AutoRAG shapes, per-account isolation and the stated caps; on a real SQLite file in a temp dir."""

from __future__ import annotations

import asyncio
import json
import zlib
from pathlib import Path

import pytest

from runtime.ai.search import documents, indexing
from runtime.ai.search.errors import EXISTS, INVALID, LIMIT, NOT_FOUND, SOURCE, AISearchError
from runtime.ai.search.service import AISearch
from runtime.bindings import BindingStores

DOCS = {
    "kettle.md": "# Zephyr kettle\n\nThe Zephyr kettle boils a litre of water in ninety seconds. "
    "It carries a two year warranty against limescale damage.\n",
    "bridge.md": "# Harbor bridge\n\nThe harbor bridge opened in 1932 and carries freight trains "
    "across the bay.\n",
    "guide/setup.md": "# Setup\n\nRun make dev to start the local edge, then open the dashboard "
    "in a browser.\n",
    "guide/deploy.md": "# Deploying\n\nRun edge deploy to publish a version; edge rollback returns "
    "to the previous one.\n",
}


def run(coro):
    return asyncio.run(coro)


@pytest.fixture
def ais(tmp_path: Path):
    s = AISearch(tmp_path)
    yield s
    s.close()


async def _indexed(
    s: AISearch, account: str = "acct", name: str = "docs", docs=DOCS, **settings
) -> list[dict]:
    await s.instance_create(account, "default", {"id": name, **settings})
    items = []
    for key, text in docs.items():
        meta = {"section": "guide"} if key.startswith("guide/") else None
        items.append(await s.item_upload(account, "default", name, key, text, meta))
    return [await s.item_wait(account, "default", name, i["id"], 30) for i in items]


def _keys(result: dict) -> list[str]:
    return [c["item"]["key"] for c in result["chunks"]]


def test_namespaces_default_create_delete(ais: AISearch):
    async def go():
        assert [n["name"] for n in await ais.namespaces("a")] == ["default"]
        made = await ais.namespace_create("a", {"name": "team-x", "description": "x"})
        assert made["name"] == "team-x" and made["instances"] == 0
        with pytest.raises(AISearchError) as exc:
            await ais.namespace_create("a", {"name": "team-x"})
        assert exc.value.code == EXISTS and exc.value.status == 409
        await ais.instance_create("a", "team-x", {"id": "one"})
        with pytest.raises(AISearchError) as exc:  # still holds an instance
            await ais.namespace_delete("a", "team-x")
        assert exc.value.code == EXISTS
        await ais.instance_delete("a", "team-x", "one")
        await ais.namespace_delete("a", "team-x")
        with pytest.raises(AISearchError) as exc:
            await ais.namespace_get("a", "team-x")
        assert exc.value.code == NOT_FOUND and exc.value.status == 404
        with pytest.raises(AISearchError):
            await ais.namespace_delete("a", "default")
        assert [n["name"] for n in await ais.namespaces("b")] == ["default"]  # b never sees a's

    run(go())


def test_instance_settings_checked(ais: AISearch):
    async def go():
        made = await ais.instance_create(
            "a", "default", {"id": "docs", "chunk_size": 128, "max_num_results": 5}
        )
        assert made["id"] == "docs" and made["chunk_size"] == 128 and made["type"] is None
        assert made["edge"]["embedder"] == ais.embedder.name
        assert not {"embedder", "embedder_dimensions", "source_dir"} & set(made)  # edge's own, under "edge"
        for body, code, words in [
            ({"id": "Bad Name"}, INVALID, "lowercase"),
            ({"id": "x", "chunk_size": 10}, INVALID, "chunk_size"),
            ({"id": "x", "max_num_results": 51}, INVALID, "max_num_results"),
            ({"id": "x", "no_such": 1}, INVALID, "unknown setting"),
            ({"id": "x", "source_dir": "/etc"}, INVALID, "wrangler-like.toml"),
            ({"id": "x", "type": "web-crawler", "source": "https://example.com"}, SOURCE, "no network"),
            ({"id": "x", "source": "https://example.com"}, SOURCE, "web-crawler"),
            ({"id": "docs"}, EXISTS, "exists"),
        ]:
            with pytest.raises(AISearchError) as exc:
                await ais.instance_create("a", "default", body)
            assert exc.value.code == code and words in exc.value.message, body
        updated = await ais.instance_update("a", "default", "docs", {"max_num_results": 7, "reranking": True})
        assert (
            updated["max_num_results"] == 7 and updated["reranking"] is True and updated["chunk_size"] == 128
        )
        listed, total = await ais.instances("a", "default")
        assert total == 1 and listed[0]["id"] == "docs"
        assert (await ais.instances("b", "default"))[1] == 0

    run(go())


def test_items_indexed_listed_downloaded_deleted(ais: AISearch):
    async def go():
        items = await _indexed(ais)
        assert {i["status"] for i in items} == {"completed"}
        assert all(i["chunks_count"] >= 1 and i["source_id"] == "builtin" for i in items)
        page, total = await ais.items("acct", "default", "docs", page=1, per_page=2)
        assert total == 4 and len(page) == 2
        (found,), _ = await ais.items("acct", "default", "docs", key="bridge.md")
        body, mime = await ais.item_download("acct", "default", "docs", found["id"])
        assert body.decode() == DOCS["bridge.md"] and mime == "text/markdown"
        chunks, n = await ais.item_chunks("acct", "default", "docs", found["id"])
        assert n == 1 and "freight trains" in chunks[0]["text"]
        await ais.item_delete("acct", "default", "docs", found["id"])
        result = await ais.search("acct", "default", ["docs"], {"query": "freight trains bay"})
        assert "bridge.md" not in _keys(result)
        with pytest.raises(AISearchError) as exc:
            await ais.item_get("acct", "default", "docs", found["id"])
        assert exc.value.code == NOT_FOUND
        stats = await ais.instance_stats("acct", "default", "docs")
        assert stats["completed"] == 3 and stats["queued"] == 0
        assert stats["engine"]["vectorize"]["vectorsCount"] >= 3

    run(go())


def test_item_checks(ais: AISearch):
    async def go():
        await ais.instance_create("a", "default", {"id": "docs"})
        for key, content, meta, words in [
            ("/abs.md", "x", None, "not starting"),
            ("a/../b.md", "x", None, "'..'"),
            ("ok.md", "x", {f"f{i}": i for i in range(6)}, "at most 5"),
            ("ok.md", "x", {"folder": "x"}, "filename/folder/timestamp"),
            ("ok.md", "x", {"tags": ["a"]}, "a string, a number or a boolean"),
            ("ok.md", 12, None, "text or bytes"),
        ]:
            with pytest.raises(AISearchError) as exc:
                await ais.item_upload("a", "default", "docs", key, content, meta)
            assert exc.value.code == INVALID and words in exc.value.message, key
        with pytest.raises(AISearchError) as exc:
            await ais.item_upload("a", "default", "docs", "big.md", b"x" * (documents.MAX_ITEM_BYTES + 1))
        assert exc.value.code == LIMIT

    run(go())


def test_a_document_that_fails_is_reported_and_the_rest_go_on(ais: AISearch):
    async def go():
        docs = {"photo.png": b"\x89PNG\r\n\x1a\n" + b"\0" * 64, **DOCS}
        items = await _indexed(ais, docs=docs)
        by_key = {i["key"]: i for i in items}
        assert by_key["photo.png"]["status"] == "error" and "image/png" in by_key["photo.png"]["error"]
        assert all(by_key[k]["status"] == "completed" for k in DOCS)
        stats = await ais.instance_stats("acct", "default", "docs")
        assert stats["error"] == 1 and "photo.png" in stats["file_embed_errors"]

    run(go())


def _pdf(text: str) -> bytes:
    """A one-page PDF with `text` in Helvetica, its xref offsets computed."""
    stream = zlib.compress(f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode())
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d /Filter /FlateDecode >>\nstream\n" % len(stream) + stream + b"\nendstream",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % i + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


def test_pdf_documents_are_indexed(ais: AISearch):
    async def go():
        items = await _indexed(ais, docs={"manual.pdf": _pdf("The pump primes itself within forty seconds.")})
        assert items[0]["status"] == "completed", items[0]["error"]
        result = await ais.search("acct", "default", ["docs"], {"query": "pump primes"})
        assert _keys(result) == ["manual.pdf"] and "forty seconds" in result["chunks"][0]["text"]
        bad = await ais.item_upload("acct", "default", "docs", "broken.pdf", b"%PDF-1.4 not really")
        bad = await ais.item_wait("acct", "default", "docs", bad["id"], 30)
        assert bad["status"] == "error" and "broken.pdf" in bad["error"]

    run(go())


@pytest.mark.parametrize("kind", ["vector", "keyword", "hybrid"])
def test_each_retrieval_type_finds_the_passage(ais: AISearch, kind: str):
    async def go():
        await _indexed(ais)
        options = {"retrieval": {"retrieval_type": kind, "keyword_match_mode": "or"}}
        result = await ais.search(
            "acct", "default", ["docs"], {"query": "kettle warranty", "ai_search_options": options}
        )
        assert _keys(result)[0] == "kettle.md"
        chunk = result["chunks"][0]
        assert chunk["type"] == "text" and "two year warranty" in chunk["text"] and chunk["score"] > 0
        assert chunk["item"]["timestamp"] > 1.7e9 and result["query_kind"] == "text"
        if kind == "hybrid":
            assert chunk["scoring_details"]["fusion_method"] == "rrf"
            assert chunk["scoring_details"]["keyword_rank"] == 1

    run(go())


def test_retrieval_options(ais: AISearch):
    async def go():
        await _indexed(ais)

        def ask(query: str, **retrieval):
            body = {
                "messages": [{"role": "user", "content": query}],
                "ai_search_options": {"retrieval": retrieval},
            }
            return ais.search("acct", "default", ["docs"], body)

        # filters: both formats, before ranking
        only_guide = await ask("run", keyword_match_mode="or", filters={"folder": "guide/"})
        assert only_guide["chunks"] and set(_keys(only_guide)) <= {"guide/setup.md", "guide/deploy.md"}
        meta = await ask("run", keyword_match_mode="or", filters={"section": {"$eq": "guide"}})
        assert set(_keys(meta)) == {"guide/setup.md", "guide/deploy.md"}
        legacy = await ask(
            "run",
            keyword_match_mode="or",
            filters={"type": "eq", "key": "filename", "value": "guide/deploy.md"},
        )
        assert _keys(legacy) == ["guide/deploy.md"]
        none = await ask("run", filters={"timestamp": {"$lt": 1000}})
        assert none["chunks"] == []
        # max_num_results, keyword_match_mode and/or, match_threshold
        assert (
            len((await ask("the edge run bay kettle", keyword_match_mode="or", max_num_results=2))["chunks"])
            == 2
        )
        assert (await ask("kettle bridge", retrieval_type="keyword"))[
            "chunks"
        ] == []  # and: no chunk has both
        assert (
            len((await ask("kettle bridge", retrieval_type="keyword", keyword_match_mode="or"))["chunks"])
            == 2
        )
        assert (await ask("kettle warranty", match_threshold=1.0))["chunks"] == []
        # context_expansion joins neighbouring chunks of the same document
        long_doc = {
            "long.md": "# Long\n\n" + " ".join(f"Sentence {i} says nothing much." for i in range(400))
        }
        await ais.instance_create("acct", "default", {"id": "long", "chunk_size": 64})
        item = await ais.item_upload("acct", "default", "long", "long.md", long_doc["long.md"])
        await ais.item_wait("acct", "default", "long", item["id"], 30)
        body = {"query": "Sentence 200", "ai_search_options": {"retrieval": {"retrieval_type": "keyword"}}}
        plain = await ais.search("acct", "default", ["long"], body)
        body["ai_search_options"]["retrieval"]["context_expansion"] = 1
        wide = await ais.search("acct", "default", ["long"], body)
        assert len(wide["chunks"][0]["text"]) > len(plain["chunks"][0]["text"]) * 2
        # unknown options and bad values are refused naming them
        for options, words in [
            ({"retrieval": {"top_k": 3}}, "retrieval.top_k"),
            ({"retrieval": {"retrieval_type": "semantic"}}, "retrieval_type"),
            ({"retrieval": {"max_num_results": 0}}, "max_num_results"),
            ({"retrieval": {"filters": {"folder": {"$like": "x"}}}}, "$like"),
            ({"nope": 1}, "ai_search_options.nope"),
        ]:
            with pytest.raises(AISearchError) as exc:
                await ais.search("acct", "default", ["docs"], {"query": "x", "ai_search_options": options})
            assert exc.value.code == INVALID and words in exc.value.message
        with pytest.raises(AISearchError) as exc:
            await ais.search("acct", "default", ["docs"], {"query": "x", "messages": []})
        assert "either query" in exc.value.message

    run(go())


def test_reranking_and_query_rewrite_use_the_local_models(ais: AISearch):
    async def go():
        await _indexed(ais)
        asked = []

        async def generate(model: str, inputs: dict):
            asked.append((model, inputs))
            return {"response": "deploy rollback version", "usage": {}}

        options = {"query_rewrite": {"enabled": True}, "reranking": {"enabled": True}}
        result = await ais.search(
            "acct", "default", ["docs"], {"query": "how do I go back", "ai_search_options": options}, generate
        )
        assert result["search_query"] == "how do I go back\ndeploy rollback version"
        assert asked and asked[0][1]["messages"][-1]["content"] == "how do I go back"
        assert _keys(result)[0] == "guide/deploy.md"
        assert "reranking_score" in result["chunks"][0]["scoring_details"]

    run(go())


def test_chat_completions_and_stream(ais: AISearch):
    async def go():
        await _indexed(ais)
        seen = {}

        async def generate(model: str, inputs: dict):
            seen.update(model=model, inputs=inputs)
            if inputs.get("stream"):

                async def events():
                    yield b'data: {"response":"Two"}\n\n'
                    yield b'data: {"response":" years."}\n\ndata: [DONE]\n\n'

                return events()
            return {
                "response": "Two years.",
                "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
            }

        body = {
            "messages": [{"role": "user", "content": "What warranty does the kettle have?"}],
            "model": "@cf/x/y",
        }
        answer = await ais.chat_completions("acct", "default", ["docs"], body, generate)
        assert (
            answer["object"] == "chat.completion"
            and answer["choices"][0]["message"]["content"] == "Two years."
        )
        assert answer["chunks"][0]["item"]["key"] == "kettle.md" and answer["usage"]["total_tokens"] == 11
        system = seen["inputs"]["messages"][0]["content"]
        assert seen["model"] == "@cf/x/y" and "two year warranty" in system and 'key="kettle.md"' in system
        stream = await ais.chat_completions("acct", "default", ["docs"], {**body, "stream": True}, generate)
        events = b"".join([e async for e in stream]).decode()
        first, *rest = events.split("\n\n")
        assert (
            first.startswith("event: chunks\ndata: ") and json.loads(first.split("data: ", 1)[1])[0]["item"]
        )
        deltas = [json.loads(e[6:]) for e in rest if e.startswith("data: {")]
        assert "".join(d["choices"][0]["delta"].get("content", "") for d in deltas) == "Two years."
        assert events.rstrip().endswith("data: [DONE]")

    run(go())


def test_legacy_autorag_shapes(ais: AISearch):
    async def go():
        await _indexed(ais)

        async def generate(model: str, inputs: dict):
            return {"response": "Run edge deploy.", "usage": {}}

        page = await ais.autorag_search("acct", "docs", {"query": "publish a version", "max_num_results": 2})
        assert page["object"] == "vector_store.search_results.page" and page["has_more"] is False
        top = page["data"][0]
        assert top["filename"] == "guide/deploy.md" and top["attributes"]["folder"] == "guide/"
        assert top["content"][0]["type"] == "text" and "edge deploy" in top["content"][0]["text"]
        answered = await ais.autorag_ai_search(
            "acct", "docs", {"query": "publish a version", "model": "@cf/m"}, generate
        )
        assert answered["response"] == "Run edge deploy." and answered["data"]
        filtered = await ais.autorag_search(
            "acct", "docs", {"query": "run", "filters": {"type": "eq", "key": "folder", "value": "guide/"}}
        )
        assert {d["filename"] for d in filtered["data"]} <= {"guide/setup.md", "guide/deploy.md"}
        with pytest.raises(AISearchError) as exc:
            await ais.autorag_search("acct", "docs", {"query": "x", "model": "m"})  # search takes no model
        assert exc.value.code == INVALID and "model" in exc.value.message

    run(go())


def test_another_account_reaches_nothing(ais: AISearch):
    async def go():
        items = await _indexed(ais, account="owner")
        for call in [
            ais.search("thief", "default", ["docs"], {"query": "kettle"}),
            ais.instance_get("thief", "default", "docs"),
            ais.instance_update("thief", "default", "docs", {"max_num_results": 3}),
            ais.instance_delete("thief", "default", "docs"),
            ais.item_get("thief", "default", "docs", items[0]["id"]),
            ais.item_download("thief", "default", "docs", items[0]["id"]),
            ais.item_upload("thief", "default", "docs", "x.md", "x"),
            ais.items("thief", "default", "docs"),
            ais.autorag_search("thief", "docs", {"query": "kettle"}),
        ]:
            with pytest.raises(AISearchError) as exc:
                await call
            assert exc.value.code == NOT_FOUND
        # the thief's own instance of the same name is another instance
        await ais.instance_create("thief", "default", {"id": "docs"})
        assert (await ais.search("thief", "default", ["docs"], {"query": "kettle"}))["chunks"] == []
        assert _keys(await ais.search("owner", "default", ["docs"], {"query": "kettle"}))[0] == "kettle.md"

    run(go())


def test_multi_instance_search_in_a_namespace(ais: AISearch):
    async def go():
        await ais.namespace_create("a", {"name": "kb"})
        for name, text in [
            ("one", "The lighthouse keeper logs every storm."),
            ("two", "The baker logs every loaf."),
        ]:
            await ais.instance_create("a", "kb", {"id": name})
            item = await ais.item_upload("a", "kb", name, f"{name}.md", text)
            await ais.item_wait("a", "kb", name, item["id"], 30)
        body = {
            "query": "who logs",
            "ai_search_options": {"instance_ids": ["one", "two"], "retrieval": {"keyword_match_mode": "or"}},
        }
        result = await ais.search("a", "kb", [], body)
        assert {c["instance_id"] for c in result["chunks"]} == {"one", "two"}
        with pytest.raises(AISearchError) as exc:
            await ais.search("a", "kb", [], {"query": "x", "ai_search_options": {"instance_ids": []}})
        assert exc.value.code == INVALID

    run(go())


def test_r2_source_synced_as_objects_change(tmp_path: Path):
    stores = BindingStores(tmp_path)
    ais = AISearch(tmp_path, stores)
    r2 = stores.store("r2")

    async def go():
        r2.call(
            "acct",
            "kb",
            "put",
            ["faq/returns.md", b"# Returns\n\nReturns are accepted within thirty days."],
            {},
        )
        made = await ais.instance_create("acct", "default", {"id": "kb", "type": "r2", "source": "kb"})
        assert made["type"] == "r2" and made["source"] == "kb"
        await ais.wait_indexed("acct", "default", "kb", 30)
        assert _keys(await ais.search("acct", "default", ["kb"], {"query": "returns thirty days"})) == [
            "faq/returns.md"
        ]
        with pytest.raises(AISearchError) as exc:  # the source's document keeps its name
            await ais.item_upload("acct", "default", "kb", "faq/returns.md", "x")
        assert exc.value.code == EXISTS
        extra = await ais.item_upload(
            "acct", "default", "kb", "notes.md", "Uploaded beside the bucket: the heron."
        )
        assert (await ais.item_wait("acct", "default", "kb", extra["id"], 30))["source_id"] == "builtin"
        # changed and new objects are indexed, removed ones dropped, by a sync (a job, or the schedule)
        await asyncio.sleep(0.01)
        r2.call(
            "acct",
            "kb",
            "put",
            ["faq/returns.md", b"# Returns\n\nReturns are accepted within ninety days."],
            {},
        )
        r2.call("acct", "kb", "put", ["faq/shipping.md", b"# Shipping\n\nParcels ship every Tuesday."], {})
        job = await ais.job_create("acct", "default", "kb")
        assert job["source"] == "user" and job["total"] == 2
        await ais.wait_indexed("acct", "default", "kb", 30)
        result = await ais.search("acct", "default", ["kb"], {"query": "returns accepted days"})
        assert "ninety days" in result["chunks"][0]["text"]
        assert (
            _keys(await ais.search("acct", "default", ["kb"], {"query": "parcels tuesday"}))[0]
            == "faq/shipping.md"
        )
        r2.call("acct", "kb", "delete", ["faq/shipping.md"], {})
        service_sync = ais._sync  # the schedule runs the same sync every SYNC_S in the background
        await ais._run("acct", service_sync, "acct", "default", "kb", "schedule", "test")
        assert "faq/shipping.md" not in _keys(
            await ais.search("acct", "default", ["kb"], {"query": "parcels tuesday"})
        )
        assert _keys(await ais.search("acct", "default", ["kb"], {"query": "heron"}))[0] == "notes.md"  # kept
        jobs, total = await ais.jobs("acct", "default", "kb")
        assert (
            total >= 2 and (await ais.job_get("acct", "default", "kb", jobs[0]["id"]))["id"] == jobs[0]["id"]
        )

    try:
        run(go())
    finally:
        ais.close()
        stores.close()


def test_background_sync_picks_up_a_new_object(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(documents, "SYNC_S", 0.05)
    stores = BindingStores(tmp_path)
    ais = AISearch(tmp_path, stores)
    r2 = stores.store("r2")

    async def go():
        await ais.instance_create("acct", "default", {"id": "kb", "source": "kb"})  # r2 inferred
        r2.call("acct", "kb", "put", ["new.md", b"The owl hunts at dusk."], {})
        for _ in range(200):
            await asyncio.sleep(0.05)
            if _keys(await ais.search("acct", "default", ["kb"], {"query": "owl dusk"})) == ["new.md"]:
                return
        raise AssertionError("the new object was never indexed")

    try:
        run(go())
    finally:
        ais.close()
        stores.close()


def test_folder_source(tmp_path: Path, ais: AISearch):
    docs = tmp_path / "project" / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "a.md").write_text("# Alpha\n\nThe alpha valve opens clockwise.")
    (docs / "sub" / "b.md").write_text("# Beta\n\nThe beta lever locks the door.")
    (docs / ".hidden.md").write_text("secret")

    async def go():
        info = await ais.sync_folder("acct", "default", "docs", docs)
        assert info["edge"]["source_dir"] == str(docs.resolve())
        await ais.wait_indexed("acct", "default", "docs", 30)
        assert _keys(await ais.search("acct", "default", ["docs"], {"query": "beta lever"}))[0] == "sub/b.md"
        keys = {i["key"] for i in (await ais.items("acct", "default", "docs"))[0]}
        assert keys == {"a.md", "sub/b.md"}
        with pytest.raises(AISearchError):
            await ais.instance_update("acct", "default", "docs", {"source": "bucket"})

    run(go())


def test_caps_are_stated_and_held(ais: AISearch, monkeypatch):
    monkeypatch.setattr(documents, "MAX_ITEMS", 2)
    monkeypatch.setattr(indexing, "MAX_CHUNKS", 3)

    async def go():
        await ais.instance_create("a", "default", {"id": "docs", "chunk_size": 64})
        await ais.item_upload("a", "default", "docs", "one.md", "one")
        await ais.item_upload("a", "default", "docs", "two.md", " ".join(["word"] * 600))
        with pytest.raises(AISearchError) as exc:
            await ais.item_upload("a", "default", "docs", "three.md", "three")
        assert exc.value.code == LIMIT and "at most 2 items" in exc.value.message
        await ais.wait_indexed("a", "default", "docs", 30)
        (big,), _ = await ais.items("a", "default", "docs", key="two.md")
        assert big["status"] == "error" and "chunks" in big["error"]
        info = await ais.instance_get("a", "default", "docs")
        assert info["edge"]["caps"]["items"] == 2

    run(go())


def test_one_accounts_flood_does_not_hold_anothers_search(ais: AISearch):
    """Indexing takes turns per account: another account's search is answered while the flooding
    account's documents are still queued (an order, not a time)."""

    async def go():
        await _indexed(ais, account="quiet")
        await ais.instance_create("flood", "default", {"id": "docs"})
        for i in range(150):
            await ais.item_upload(
                # 7 KB each: indexing one takes several times its upload, so the queue stays long
                "flood",
                "default",
                "docs",
                f"d{i}.md",
                f"# Doc {i}\n\n" + "filler text " * 600,
            )
        result = await ais.search("quiet", "default", ["docs"], {"query": "kettle warranty"})
        assert _keys(result)[0] == "kettle.md"
        stats = await ais.instance_stats("flood", "default", "docs")
        assert stats["queued"] > 0

    run(go())


def test_progress_for_the_dashboard(ais: AISearch):
    from runtime.control.dashboard_feed import DashboardFeed
    from runtime.routes.dashboard_view import SnapshotBuilder

    async def go():
        await _indexed(ais, docs={"photo.png": b"\x89PNG\r\n\x1a\n", **DOCS})

    run(go())
    (row,) = ais.progress()
    assert row["account"] == "acct" and row["instance"] == "docs" and row["documents"] == 5
    assert row["completed"] == 4 and row["error"] == 1 and row["chunks"] >= 4
    assert row["last_error"].startswith("photo.png: ")

    class NoPoPs:
        nodes: dict = {}

    snapshot = SnapshotBuilder(NoPoPs(), DashboardFeed(), None, ais.progress).build()
    assert snapshot["ai_search"] == [row]


def test_a_source_document_over_the_cap_is_an_item_in_error(tmp_path: Path, ais: AISearch, monkeypatch):
    monkeypatch.setattr(documents, "MAX_ITEM_BYTES", 100)
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "small.md").write_text("The wren nests low.")
    (folder / "big.md").write_text("word " * 100)

    async def go():
        await ais.sync_folder("acct", "default", "docs", folder)
        await ais.wait_indexed("acct", "default", "docs", 30)
        (big,), _ = await ais.items("acct", "default", "docs", key="big.md")
        assert big["status"] == "error" and "at most" in big["error"]
        (small,), _ = await ais.items("acct", "default", "docs", key="small.md")
        assert small["status"] == "completed"
        jobs, _ = await ais.jobs("acct", "default", "docs")
        assert jobs[0]["errors"] == 1 and jobs[0]["documents"] == 1

    run(go())


def test_an_instance_keeps_the_embedder_it_was_indexed_with(tmp_path: Path):
    """Vectors of one embedder are never searched with another: an instance indexed with the
    stand-in keeps it after the default changes; one whose embedder is gone is indexed again."""
    from runtime.ai.search.embedder import HashedNgrams

    class Other(HashedNgrams):
        name = "test/other-embedder"

    async def index(s: AISearch) -> None:
        await _indexed(s)

    first = AISearch(tmp_path, embedder=HashedNgrams(384))
    run(index(first))
    first.close()
    second = AISearch(tmp_path, embedder=Other(256))  # a new default, 256 wide

    async def go():
        info = await second.instance_get("acct", "default", "docs")
        assert info["edge"]["embedder"] == HashedNgrams.name
        assert (
            _keys(await second.search("acct", "default", ["docs"], {"query": "kettle warranty"}))[0]
            == "kettle.md"
        )
        made = await second.instance_create("acct", "default", {"id": "new"})
        assert made["edge"]["embedder"] == "test/other-embedder" and made["edge"]["dimensions"] == 256

    run(go())
    second.close()
    # the "new" instance's embedder is not known to a runtime without it: indexed again
    third = AISearch(tmp_path)

    async def again():
        item = await third.item_upload("acct", "default", "new", "owl.md", "The owl hunts at dusk.")
        await third.item_wait("acct", "default", "new", item["id"], 30)
        info = await third.instance_get("acct", "default", "new")
        assert info["edge"]["embedder"] == third.embedder.name
        assert _keys(await third.search("acct", "default", ["new"], {"query": "owl dusk"}))[0] == "owl.md"

    run(again())
    third.close()
