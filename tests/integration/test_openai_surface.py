"""The OpenAI request surface with the official `openai` client against a running `edge dev`:
refused parameters get a 400 naming them, unknown fields too, logit_bias is honoured, content
parts and `developer` are read, an image part is refused, models.retrieve, embeddings (BGE names;
a text generation model's name a 404)
from the API (never the user's worker), and stream_options.include_usage ends the stream with the
usage chunk."""

import textwrap

import pytest

from tests.integration.dev_server import REPO, DevServer

openai = pytest.importorskip("openai")
pytestmark = pytest.mark.slow
MODEL = "@edge/moonshotai/kimi-k2-mini"
USER = [{"role": "user", "content": "def"}]

WORKER = """
from workers import Response

async def on_fetch(request, env):
    return Response("the user's worker", status=200)
"""


@pytest.fixture(scope="module")
def client(tmp_path_factory):
    d = tmp_path_factory.mktemp("openai-surface")
    (d / "worker.py").write_text(textwrap.dedent(WORKER))
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent(f"""
        name = "surface"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge]
        pops = ["ICN"]
        models = ["{MODEL}"]
        models_dir = "{REPO / "models"}"
    """)
    )
    with DevServer(d / "wrangler-like.toml", cwd=d) as srv:
        token = (d / ".edge" / "api-token").read_text().strip()
        yield openai.OpenAI(
            base_url=f"{srv.url}/client/v4/accounts/local/ai/v1", api_key=token, max_retries=0
        )


REFUSED = [
    ("audio", {"audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text"]}),
    ("modalities", {"modalities": ["text", "audio"]}),
    ("prediction", {"prediction": {"type": "content", "content": "x"}}),
    ("web_search_options", {"web_search_options": {}}),
    ("functions", {"functions": [{"name": "f", "parameters": {}}]}),
    ("function_call", {"function_call": "auto"}),
    ("store", {"store": True}),
    ("service_tier", {"service_tier": "flex"}),
    ("logit_bias", {"logit_bias": {"1": 101}}),
    ("logit_bias", {"logit_bias": {"99999": 1}}),  # past any vocabulary
    ("n", {"n": 9}),
    ("top_logprobs", {"logprobs": True, "top_logprobs": 21}),
    (
        "reasoning_effort",
        {"reasoning_effort": "high", "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}},
    ),
    ("lora", {"extra_body": {"lora": "adapter"}}),
    ("surprise", {"extra_body": {"surprise": 1}}),
]


@pytest.mark.parametrize(("param", "kwargs"), REFUSED, ids=[p for p, _ in REFUSED])
def test_each_refused_parameter_is_a_400_naming_it(client, param, kwargs):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(model=MODEL, messages=USER, max_tokens=2, **kwargs)
    error = err.value.body
    assert (
        err.value.status_code == 400 and error["param"] == param and error["type"] == "invalid_request_error"
    )
    assert error["message"].startswith(f"{param}: ")


def test_logit_bias_forces_the_token_it_names(client):
    def tokens(bias):
        chat = client.chat.completions.create(
            model=MODEL, messages=USER, max_tokens=4, temperature=1, seed=1, logprobs=True, logit_bias=bias
        )
        return [t.token for t in chat.choices[0].logprobs.content]

    forced = tokens({"300": 100})
    assert len(forced) == 4 and len(set(forced)) == 1
    other = tokens({"301": 100})
    assert len(set(other)) == 1 and other != forced


def test_content_parts_and_developer_are_read_and_an_image_part_is_refused(client):
    parts = [{"type": "text", "text": "def"}, {"type": "text", "text": "fib"}]
    messages = [{"role": "developer", "content": "python"}, {"role": "user", "content": parts}]
    chat = client.chat.completions.create(
        model=MODEL, messages=messages, max_completion_tokens=3, temperature=0
    )
    assert chat.choices[0].message.role == "assistant" and chat.usage.completion_tokens <= 3
    image = [{"type": "image_url", "image_url": {"url": "https://example.com/cat.png"}}]
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": image}], max_tokens=2
        )
    assert err.value.body["param"] == "messages.0.content.0" and "no images" in err.value.body["message"]


def test_models_retrieve_and_embeddings_come_from_the_api(client):
    assert client.models.retrieve(MODEL).id == MODEL
    with pytest.raises(openai.NotFoundError) as err:
        client.models.retrieve("@edge/none")
    assert err.value.body["code"] == "model_not_found"
    with pytest.raises(openai.NotFoundError) as err:
        client.embeddings.create(model=MODEL, input="x")
    assert "the embedding models are @cf/baai/bge-small-en-v1.5" in err.value.body["message"]
    vectors = client.embeddings.create(model="@cf/baai/bge-base-en-v1.5", input=["one", "two"])
    assert [len(d.embedding) for d in vectors.data] == [768, 768] and vectors.data[1].index == 1


def test_include_usage_ends_the_stream_with_a_usage_chunk(client):
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=USER,
            max_tokens=3,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert all(c.usage is None for c in chunks[:-1])
    last = chunks[-1]
    assert last.choices == [] and 0 < last.usage.completion_tokens <= 3
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens
    assert any(c.choices and c.choices[0].finish_reason for c in chunks[:-1])
