"""The embedding stand-in behind Cloudflare's BGE names: deterministic, at each model's width, unit
length, related texts above unrelated ones; its input checks (5006) and both HTTP doors."""

import numpy as np
import pytest

from runtime.ai.embeddings import (
    EMBEDDING_MODELS,
    MAX_TEXTS,
    embed,
    openai_request,
    texts_of,
    workers_ai_inputs,
)
from workers import AIError

BASE = "@cf/baai/bge-base-en-v1.5"


def test_each_name_answers_at_its_documented_width_with_unit_vectors_the_same_every_time():
    assert EMBEDDING_MODELS == {
        "@cf/baai/bge-small-en-v1.5": 384,
        "@cf/baai/bge-base-en-v1.5": 768,
        "@cf/baai/bge-large-en-v1.5": 1024,
        "@cf/baai/bge-m3": 1024,
    }
    for model, width in EMBEDDING_MODELS.items():
        first = embed(model, ["The quick brown fox", "jumps over the lazy dog"]).vectors
        assert first.shape == (2, width) and first.dtype == np.float32
        assert np.allclose(np.linalg.norm(first, axis=1), 1.0, atol=1e-5)
        assert np.array_equal(first, embed(model, ["The quick brown fox", "jumps over the lazy dog"]).vectors)


def test_related_texts_score_above_unrelated_ones():
    v = embed(
        BASE,
        [
            "How do capybaras live in South America?",
            "Capybaras are the largest rodents and live in groups near rivers in South America.",
            "The stock market closed higher after the central bank's announcement.",
            "Vector databases store embeddings for similarity search.",
        ],
    ).vectors
    scores = v[1:] @ v[0]
    assert scores[0] > 0.3 and scores[0] > 3 * max(abs(scores[1]), abs(scores[2]))
    pieces = embed(BASE, ["embedding vectors", "embeddings and vector search", "a red bicycle"]).vectors
    assert pieces[0] @ pieces[1] > pieces[0] @ pieces[2] + 0.1  # word pieces: "embedding" ~ "embeddings"


def test_inputs_are_checked_with_5006_saying_what_to_change():
    assert workers_ai_inputs(BASE, {"text": "one"}) == (["one"], "mean")
    for inputs, words in [
        ({"text": []}, "a list of 1 to 100"),
        ({"text": ["x"] * (MAX_TEXTS + 1)}, "at most 100 are embedded at once"),
        ({"text": ["ok", 3]}, "text.1: must be a string"),
        ({"text": ["  "]}, "must not be empty"),
        ({"text": ["x" * 40_000]}, "split the text"),
        ({"text": "x", "prompt": "y"}, "prompt: "),
        ({}, "text: required"),
        ({"text": "x", "pooling": "max"}, "pooling"),
    ]:
        with pytest.raises(AIError, match=words) as err:
            workers_ai_inputs(BASE, inputs)
        assert err.value.code == 5006
    with pytest.raises(AIError) as err:
        openai_request(
            {"model": "@edge/zai-org/glm-4.5-air-mini", "input": "x"}, ["@edge/zai-org/glm-4.5-air-mini"]
        )
    assert err.value.code == 5007 and "text generation model" in err.value.detail and BASE in err.value.detail
    assert openai_request({"model": BASE, "input": ["a", "b"]}, []) == (BASE, ["a", "b"])
    with pytest.raises(AIError, match="dimensions: "):
        openai_request({"model": BASE, "input": "a", "dimensions": 3}, [])
    assert texts_of("single") == ["single"]
    with pytest.raises(AIError, match="encoding_format"):
        openai_request({"model": BASE, "input": "a", "encoding_format": "int8"}, [])


def test_openai_base64_vectors_are_the_float32_bytes():
    import base64

    from runtime.ai.embeddings import openai_answer

    result = embed(BASE, ["one text"])
    packed = openai_answer(result, BASE, "base64")["data"][0]["embedding"]
    assert np.array_equal(np.frombuffer(base64.b64decode(packed), dtype="<f4"), result.vectors[0])


def test_strict_models_refuses_the_stand_in_and_a_served_call_counts_its_tokens():
    import asyncio

    from runtime.ai.call import EMBEDDINGS, AICall
    from runtime.ai.service import AIService

    service = AIService(edge=None)
    result = asyncio.run(service.embed(AICall(BASE, ["two words"], "acct", shape=EMBEDDINGS)))
    assert result.vectors.shape == (1, 768) and result.tokens == 2
    service.serve_embeddings = False
    with pytest.raises(AIError, match="strict_models") as err:
        asyncio.run(service.embed(AICall(BASE, ["x"], "acct", shape=EMBEDDINGS)))
    assert err.value.code == 5007
