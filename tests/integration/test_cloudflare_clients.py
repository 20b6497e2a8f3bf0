"""Cloudflare's own Python clients, unmodified and pinned (pyproject's test group: `cloudflare`,
`langchain-cloudflare`), against a running `edge dev` with their documented base-URL settings: the
Workers AI calls (whole and streamed, sync and async), the model routes, toMarkdown, JSON mode's
object, the REST body's `options.rejectIfBusy` and the unified `cf-aig-gateway-id` header.
The AI Gateway's own routes through the SDK: test_cloudflare_clients_gateway.py."""

from __future__ import annotations

import asyncio
import textwrap

import httpx
import pytest

from tests.integration.dev_server import REPO, DevServer

cloudflare = pytest.importorskip("cloudflare")
langchain_cloudflare = pytest.importorskip("langchain_cloudflare")
pytestmark = pytest.mark.slow

GLM = "@edge/zai-org/glm-4.5-mini"
LLAMA = "@cf/meta/llama-3.1-8b-instruct"  # a Cloudflare name in Workers AI's text-generation shape
BGE = "@cf/baai/bge-small-en-v1.5"
ACCOUNT = "local"
ASK = [{"role": "user", "content": "What is the capital of Japan?"}]
COUNTRY = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "capital": {"type": "string"}},
    "required": ["name", "capital"],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    d = tmp_path_factory.mktemp("cloudflare-clients")
    (d / "worker.py").write_text(
        "from workers import Response\n\nasync def on_fetch(request, env):\n    return Response('w')\n"
    )
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "clients"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge]
        pops = ["ICN"]
        models = ["{GLM}"]
        models_dir = "{REPO / "models"}"
    """)
    )
    with DevServer(d / "wrangler-like.toml", cwd=d) as srv:
        srv.token = (d / ".edge" / "api-token").read_text().strip()
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return cloudflare.Cloudflare(api_token=server.token, base_url=f"{server.url}/client/v4", max_retries=0)


def chat(server, **kwargs):
    return langchain_cloudflare.ChatCloudflareWorkersAI(
        model=GLM,
        account_id=ACCOUNT,
        api_token=server.token,
        base_url=f"{server.url}/client/v4",
        temperature=0,
        max_tokens=12,
        **kwargs,
    )


def embeddings(server, **kwargs):
    return langchain_cloudflare.CloudflareWorkersAIEmbeddings(
        model_name=BGE,
        account_id=ACCOUNT,
        api_token=server.token,
        api_base_url=f"{server.url}/client/v4/accounts",
        **kwargs,
    )


def gateway_rows(server, gateway: str) -> list[dict]:
    r = httpx.get(
        f"{server.url}/client/v4/accounts/{ACCOUNT}/ai-gateway/gateways/{gateway}/logs",
        params={"per_page": 50},
        headers={"authorization": f"Bearer {server.token}"},
    )
    assert r.status_code == 200, r.text
    return r.json()["result"]


# --- the cloudflare SDK: Workers AI ------------------------------------------------------------------


def test_run_whole_streamed_embedded_and_async(client):
    answer = client.ai.run(GLM, account_id=ACCOUNT, messages=ASK, max_tokens=4, temperature=0)
    assert answer["object"] == "chat.completion" and answer["usage"]["completion_tokens"] <= 4
    # the SDK's ai.run parses JSON; a stream is read through its streaming response, as on Cloudflare
    with client.ai.with_streaming_response.run(
        GLM, account_id=ACCOUNT, messages=ASK, max_tokens=4, stream=True
    ) as streamed:
        lines = [line for line in streamed.iter_lines() if line.startswith("data: ")]
    assert lines[-1] == "data: [DONE]" and len(lines) >= 2
    vectors = client.ai.run(BGE, account_id=ACCOUNT, text=["one", "two"])
    assert vectors["shape"] == [2, 384]

    async def run_async():
        async with cloudflare.AsyncCloudflare(
            api_token=client.api_token, base_url=str(client.base_url), max_retries=0
        ) as aclient:
            return await aclient.ai.run(GLM, account_id=ACCOUNT, messages=ASK, max_tokens=3)

    assert asyncio.run(run_async())["object"] == "chat.completion"


def test_errors_map_onto_the_sdk_exceptions_and_batches_queue(client):
    with pytest.raises(cloudflare.BadRequestError) as err:
        client.ai.run("@edge/none", account_id=ACCOUNT, prompt="x")
    assert err.value.body["errors"][0]["code"] == 5007
    other = cloudflare.Cloudflare(api_token="nope", base_url=str(client.base_url), max_retries=0)
    with pytest.raises(cloudflare.AuthenticationError):
        other.ai.run(GLM, account_id=ACCOUNT, prompt="x")
    queued = client.ai.run(
        GLM,
        account_id=ACCOUNT,
        extra_body={"requests": [{"messages": ASK, "max_tokens": 2}]},
        extra_query={"queueRequest": "true"},
    )
    assert queued["status"] == "queued" and queued["model"] == GLM


def test_json_mode_answers_the_parsed_object_in_workers_ai_shape(client):
    """Cloudflare's JSON Mode page: `response` is the object; OpenAI's shape keeps a string."""
    fmt = {"type": "json_schema", "json_schema": COUNTRY}
    answer = client.ai.run(
        LLAMA, account_id=ACCOUNT, messages=ASK, max_tokens=40, temperature=0, response_format=fmt
    )
    assert isinstance(answer["response"], dict) and {"name", "capital"} <= set(answer["response"])
    any_json = client.ai.run(
        LLAMA, account_id=ACCOUNT, messages=ASK, max_tokens=10, response_format={"type": "json_object"}
    )
    assert isinstance(any_json["response"], dict)
    chat_shape = client.ai.run(GLM, account_id=ACCOUNT, messages=ASK, max_tokens=40, response_format=fmt)
    assert isinstance(chat_shape["choices"][0]["message"]["content"], str)


def test_models_list_paginates_and_the_model_routes_answer(client):
    models = list(client.ai.models.list(account_id=ACCOUNT, per_page=3))
    names = [m["name"] for m in models]
    assert GLM in names and len(names) == len(set(names)) > 3  # every page, each model once
    schema = client.ai.models.schema.get(account_id=ACCOUNT, model=GLM)
    assert schema.input.type == "object" and "messages" in schema.input.model_extra["properties"]
    assert schema.output.type == "object"
    embedding = client.ai.models.schema.get(account_id=ACCOUNT, model=BGE)
    assert embedding.input.model_extra["required"] == ["text"]
    with pytest.raises(cloudflare.NotFoundError):
        client.ai.models.schema.get(account_id=ACCOUNT, model="@edge/none")
    tasks = {t["name"] for t in client.ai.tasks.list(account_id=ACCOUNT)}
    assert {"Text Generation", "Text Embeddings"} <= tasks
    authors = {a["name"] for a in client.ai.authors.list(account_id=ACCOUNT)}
    assert {"zai-org", "baai", "meta"} <= authors


def test_to_markdown_converts_uploaded_files(client, server):
    supported = list(client.ai.to_markdown.supported(account_id=ACCOUNT))
    assert {"extension": "html", "mime_type": "text/html"} in [
        {"extension": s.extension, "mime_type": s.mime_type} for s in supported
    ]
    # the SDK 5.9.0's own transform() fails before it sends (a TypeError in its client: README's
    # compatibility table); the route answers the multipart upload it means to send
    with pytest.raises(TypeError):
        client.ai.to_markdown.transform(account_id=ACCOUNT, file={"files": [b"<h1>x</h1>"]})
    files = [
        ("files", ("page.html", b"<h1>Hello</h1><p>A <b>bold</b> claim.</p>", "text/html")),
        ("files", ("scan.pdf", b"%PDF-1.4", "application/pdf")),
    ]
    r = httpx.post(
        f"{server.url}/client/v4/accounts/{ACCOUNT}/ai/tomarkdown",
        files=files,
        headers={"authorization": f"Bearer {server.token}"},
    )
    page, pdf = r.json()["result"]
    assert page["format"] == "markdown" and page["data"].startswith("# Hello") and page["tokens"].isdigit()
    assert pdf["format"] == "error" and "cannot be converted" in pdf["error"]


# --- options.rejectIfBusy and cf-aig-gateway-id, through langchain-cloudflare -----------------------


@pytest.mark.parametrize("endpoint_format", ["workers_ai", "openai_compatible"])
def test_langchain_reject_if_busy_and_ai_gateway_for_chat(server, endpoint_format):
    gateway = f"lc-{endpoint_format.replace('_', '-')}"
    llm = chat(server, reject_if_busy=True, ai_gateway=gateway, endpoint_format=endpoint_format)
    message = llm.invoke("What is the capital of Japan?")
    assert isinstance(message.content, str) and message.content
    pieces = list(llm.stream("What is the capital of Japan?"))
    assert "".join(p.content for p in pieces)
    rows = gateway_rows(server, gateway)
    assert len(rows) == 2 and all(r["success"] and r["model"] == GLM for r in rows)


def test_langchain_reject_if_busy_and_ai_gateway_for_embeddings(server):
    embedder = embeddings(server, reject_if_busy=True, ai_gateway="lc-embed")
    assert len(embedder.embed_query("hello")) == 384
    assert [len(v) for v in embedder.embed_documents(["a", "b"])] == [384, 384]
    rows = gateway_rows(server, "lc-embed")
    assert len(rows) == 2 and {r["model"] for r in rows} == {BGE}


def test_rest_options_are_read_and_others_refused(server):
    url = f"{server.url}/client/v4/accounts/{ACCOUNT}/ai/run/{GLM}"
    auth = {"authorization": f"Bearer {server.token}"}
    ok = httpx.post(
        url, headers=auth, json={"messages": ASK, "max_tokens": 2, "options": {"rejectIfBusy": True}}
    )
    assert ok.status_code == 200, ok.text
    bad = httpx.post(url, headers=auth, json={"messages": ASK, "options": {"queueRequest": True}})
    error = bad.json()["errors"][0]
    assert bad.status_code == 400 and error["code"] == 5004 and "rejectIfBusy" in error["message"]


def test_the_gateway_header_routes_the_call_through_its_cache(server):
    url = f"{server.url}/client/v4/accounts/{ACCOUNT}/ai/run/{GLM}"
    headers = {
        "authorization": f"Bearer {server.token}",
        "cf-aig-gateway-id": "hdr",
        "cf-aig-cache-ttl": "60",
    }
    body = {"messages": ASK, "max_tokens": 3, "temperature": 0}
    first = httpx.post(url, headers=headers, json=body)
    second = httpx.post(url, headers=headers, json=body)
    assert first.headers["cf-aig-cache-status"] == "MISS" and second.headers["cf-aig-cache-status"] == "HIT"
    assert first.json()["result"]["choices"] == second.json()["result"]["choices"]
    assert {first.headers["cf-aig-log-id"], second.headers["cf-aig-log-id"]} == {
        r["id"] for r in gateway_rows(server, "hdr")
    }


# --- langchain-cloudflare: what already worked stays working ---------------------------------------


def test_langchain_tools_structured_output_and_async(server):
    llm = chat(server)

    def get_weather(city: str) -> str:
        """The weather in a city."""
        return f"sunny in {city}"

    called = llm.bind_tools([get_weather], tool_choice="get_weather").invoke("What's the weather in Oslo?")
    assert called.tool_calls and called.tool_calls[0]["name"] == "get_weather"
    # JSON mode (the function-calling method leaves the call to the model's choice: issue 56's matter)
    structured = llm.with_structured_output(COUNTRY, method="json_mode").invoke("Tell me about Japan.")
    assert isinstance(structured, dict)

    async def both():
        whole = await llm.ainvoke("Hi")
        streamed = [p async for p in llm.astream("Hi")]
        return whole, streamed

    whole, streamed = asyncio.run(both())
    assert whole.content and "".join(p.content for p in streamed)


def test_the_gateway_compat_door_serves_embeddings_and_its_models(server):
    openai = pytest.importorskip("openai")
    compat = openai.OpenAI(
        base_url=f"{server.url}/cdn-cgi/ai-gateway/v1/{ACCOUNT}/compat-gw/compat",
        api_key=server.token,
        max_retries=0,
    )
    vectors = compat.embeddings.create(model=f"workers-ai/{BGE}", input=["one", "two"])
    assert [len(d.embedding) for d in vectors.data] == [384, 384]
    ids = {m.id for m in compat.models.list()}
    assert {f"workers-ai/{GLM}", f"workers-ai/{BGE}"} <= ids
    with pytest.raises(openai.BadRequestError) as err:
        compat.embeddings.create(model="openai/text-embedding-3-small", input="x")
    assert "cannot be reached from this edge" in err.value.body["message"]
    rows = gateway_rows(server, "compat-gw")
    assert len(rows) == 1 and rows[0]["model"] == BGE and rows[0]["success"]


def test_the_gateway_door_reads_body_options(server):
    url = f"{server.url}/cdn-cgi/ai-gateway/v1/{ACCOUNT}/door-gw/workers-ai/{GLM}"
    auth = {"authorization": f"Bearer {server.token}"}
    ok = httpx.post(
        url, headers=auth, json={"messages": ASK, "max_tokens": 2, "options": {"rejectIfBusy": True}}
    )
    assert ok.status_code == 200, ok.text
