"""Text embeddings under Cloudflare's BGE names, computed by a disclosed deterministic stand-in.

`env.AI.run("@cf/baai/bge-base-en-v1.5", {"text": ["..."]})` answers Cloudflare's shape,
`{"shape": [n, 768], "data": [[...], ...], "pooling": "mean"}`, at each model's documented width
(small 384, base 768, large 1024, m3 1024), so an index created for one of Cloudflare's tutorials
takes these vectors as it would BGE's. No BGE weights ship here (and none can be fetched), so the
vectors come from HASHED_NGRAMS: word unigrams and bigrams and the words' character 3- to 5-grams,
each weighted by 1 + log(tf) (stop words a tenth), signed-feature-hashed (blake2b, so the same text
gives the same vector in every process) into the width and L2-normalized. Texts that share words
(or word pieces: "embed" and "embedding") score high in cosine, unrelated texts near 0: a lexical
retriever, which is what a RAG question whose words appear in one passage needs. It knows no
synonyms, which BGE would; every answer's `served_by` says what computed it, and `timing` that it
ran in the runtime's process on its CPU, not on a GPU PoP.

Inputs are checked as Workers AI's schema checks them: a refusal is code 5006 (Cloudflare's input
validation error), naming the field and what to change.
"""

from __future__ import annotations

import base64
import hashlib
import math
import re
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass
from typing import Any

import numpy as np

from runtime.ai.cloudflare_names import EMBEDDING_MODELS, EMBEDDING_SOURCE
from runtime.control.fair_pool import run_inline
from workers import AIError

INVALID = 5006  # Workers AI's "input validation failed"
HASHED_NGRAMS = "edge/hashed-ngrams-v1"
METHOD = (
    "word unigrams and bigrams and character 3-5-grams, 1 + log(tf) weights, signed feature hashing "
    "(blake2b) into the model's width, L2-normalized; deterministic, lexical (no synonyms)"
)
MAX_TEXTS = 100  # texts in one call, as Cloudflare allows
MAX_CHARS = 32_768  # characters in one text (bge-m3 reads 8,192 tokens, about this much English)
POOLING = ("mean", "cls")

# weights of each feature family: whole words count most, a shared word pair adds, word pieces
# catch inflections ("vector" in "vectors") without swamping the words
WORD, BIGRAM, PIECE = 1.0, 0.5, 0.15
STOP_WEIGHT = 0.1
STOP_WORDS = frozenset(
    "a an and are as at be by can do does for from has have how i in is it its of on or that the "
    "this to was were what when where which who why will with you your".split()
)
_WORD = re.compile(r"\w+", re.UNICODE)


__all__ = ["EMBEDDING_MODELS", "EMBEDDING_SOURCE", "embed", "is_embedding_model", "texts_of"]


def is_embedding_model(name: Any) -> bool:
    return isinstance(name, str) and name in EMBEDDING_MODELS


def words(text: str) -> list[str]:
    """The text's words, case- and compatibility-folded (NFKC), as the features read them."""
    return _WORD.findall(unicodedata.normalize("NFKC", text).casefold())


def features(text: str) -> Counter[str]:
    """Each feature of `text` with its raw weight (count times its family's weight)."""
    tokens = words(text)
    out: Counter[str] = Counter()
    for i, word in enumerate(tokens):
        stop = STOP_WEIGHT if word in STOP_WORDS else 1.0
        out["w:" + word] += WORD * stop
        if i + 1 < len(tokens):
            out["b:" + word + " " + tokens[i + 1]] += BIGRAM * stop
        if stop == 1.0 and len(word) > 3:
            marked = f"<{word}>"
            for n in (3, 4, 5):
                for j in range(len(marked) - n + 1):
                    out["c:" + marked[j : j + n]] += PIECE
    return out


def _slot(feature: str, width: int) -> tuple[int, float]:
    digest = hashlib.blake2b(feature.encode("utf-8", "surrogatepass"), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return value % width, (1.0 if value >> 63 else -1.0)


def embed_text(text: str, width: int) -> np.ndarray:
    """One text's unit vector of `width` float32s (all zeros only for a text with no word)."""
    vector = np.zeros(width, dtype=np.float64)
    for feature, weight in features(text).items():
        slot, sign = _slot(feature, width)
        vector[slot] += sign * (1.0 + math.log(weight)) if weight >= 1.0 else sign * weight
    norm = float(np.linalg.norm(vector))
    if norm > 0:
        vector /= norm
    return vector.astype(np.float32)


@dataclass(frozen=True)
class Embeddings:
    """One call's vectors, with what the answer reports about them."""

    model: str
    vectors: np.ndarray  # (n, width) float32, each row unit length
    tokens: int  # words read, as the usage counts them
    elapsed_ms: float
    pooling: str = "mean"


def texts_of(inputs: Any, param: str = "text") -> list[str]:
    """The texts of a call: one string or a list of 1..MAX_TEXTS, each 1..MAX_CHARS characters;
    AIError 5006 naming what to change."""
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list) or not texts:
        raise AIError(INVALID, f"{param}: send a string or a list of 1 to {MAX_TEXTS} strings", param)
    if len(texts) > MAX_TEXTS:
        raise AIError(
            INVALID,
            f"{param}: {len(texts)} texts in one call; at most {MAX_TEXTS} are embedded at once: "
            "split them over several calls",
            param,
        )
    for i, text in enumerate(texts):
        where = f"{param}.{i}" if not isinstance(inputs, str) else param
        if not isinstance(text, str):
            raise AIError(INVALID, f"{where}: must be a string, got {type(text).__name__}", where)
        if not text.strip():
            raise AIError(INVALID, f"{where}: must not be empty; send the text to embed", where)
        if len(text) > MAX_CHARS:
            raise AIError(
                INVALID,
                f"{where}: {len(text)} characters; at most {MAX_CHARS} are embedded: split the text "
                "into passages (retrieval works best on passages of a few hundred words)",
                where,
            )
    return texts


def embed(model: str, texts: list[str], pooling: str = "mean") -> Embeddings:
    """The vectors of checked `texts` (texts_of) in `model`'s width."""
    return run_inline(embed_slices(model, texts, pooling))


def embed_slices(model: str, texts: list[str], pooling: str = "mean"):
    """embed() a text a slice, for the runtime's fair pool (runtime.control.fair_pool): a batch of
    long texts takes turns with other accounts' calls instead of holding a thread for its whole
    length (a 32 KiB text takes tens of milliseconds, a call holds up to MAX_TEXTS)."""
    started = time.perf_counter()
    width = EMBEDDING_MODELS[model]
    rows, tokens = [], 0
    for text in texts:
        yield
        rows.append(embed_text(text, width))
        tokens += max(1, len(words(text)))
    return Embeddings(model, np.stack(rows), tokens, (time.perf_counter() - started) * 1000, pooling)


def workers_ai_inputs(model: str, inputs: Any) -> tuple[list[str], str]:
    """env.AI.run's / POST /ai/run's inputs for an embedding model: {"text": str | [str],
    "pooling"?: "mean" | "cls"}; AIError 5006 for anything else."""
    if not isinstance(inputs, dict):
        raise AIError(INVALID, f"inputs: {model} takes {{'text': ['...']}}, got {type(inputs).__name__}")
    unknown = sorted(str(k) for k in inputs if k not in ("text", "pooling"))
    if unknown:
        raise AIError(
            INVALID,
            f"{unknown[0]}: {model} takes 'text' (a string or a list of strings) and 'pooling' "
            f"({' or '.join(POOLING)}), not {', '.join(unknown)}",
            unknown[0],
        )
    if "text" not in inputs:
        raise AIError(INVALID, "text: required; send {'text': ['...']}", "text")
    pooling = inputs.get("pooling", "mean")
    if pooling not in POOLING:
        raise AIError(INVALID, f"pooling: must be 'mean' or 'cls', got {pooling!r}", "pooling")
    return texts_of(inputs["text"]), pooling


def catalog_entries() -> list[dict[str, Any]]:
    """The embedding names as the models search API lists them (runtime.ai.catalog.catalog_view)."""
    return [
        {
            "id": name,
            "name": name,
            "description": f"{name} on Workers AI ({width} dimensions); not shipped here: "
            f"{HASHED_NGRAMS} answers at its width ({METHOD}).",
            "task": {"name": "Text Embeddings"},
            "schema": "text-embeddings",
            "properties": [{"property_id": "dimensions", "value": str(width)}],
            "served": True,
            "served_by": served_by(name),
            "aliases": [],
            "inputs": {"parameters": ["pooling", "text"], "max_texts": MAX_TEXTS, "max_chars": MAX_CHARS},
            "source": EMBEDDING_SOURCE,
        }
        for name, width in EMBEDDING_MODELS.items()
    ]


def served_by(model: str) -> dict[str, Any]:
    return {
        "model": HASHED_NGRAMS,
        "stand_in": True,
        "for": model,
        "method": METHOD,
        "computed_in": "the runtime's process, on its CPU (not on a GPU PoP)",
    }


def timing(result: Embeddings) -> dict[str, Any]:
    """What the call cost: no network hop and no PoP queue, since it ran in the runtime."""
    return {"where": "runtime (CPU), not a GPU PoP", "embed_ms": round(result.elapsed_ms, 3)}


def workers_ai_answer(result: Embeddings) -> dict[str, Any]:
    """Cloudflare's answer, with the usage, timing and served_by every answer here carries."""
    n, width = result.vectors.shape
    return {
        "shape": [n, width],
        "data": result.vectors.tolist(),
        "pooling": result.pooling,
        "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
        "timing": timing(result),
        "served_by": served_by(result.model),
    }


def openai_answer(result: Embeddings, model: str, encoding: str = "float") -> dict[str, Any]:
    """OpenAI's embeddings list; `encoding` "base64": each vector as its little-endian float32
    bytes in base64, as OpenAI sends them (its Python client asks for that by default)."""
    rows: list[Any] = (
        [base64.b64encode(row.astype("<f4").tobytes()).decode("ascii") for row in result.vectors]
        if encoding == "base64"
        else result.vectors.tolist()
    )
    return {
        "object": "list",
        "data": [{"object": "embedding", "index": i, "embedding": row} for i, row in enumerate(rows)],
        "model": model,
        "usage": {"prompt_tokens": result.tokens, "total_tokens": result.tokens},
        "served_by": served_by(result.model),
    }


OPENAI_FIELDS = ("input", "model", "encoding_format", "dimensions", "user")


def openai_request(body: Any, names: list[str]) -> tuple[str, list[str]]:
    """OpenAI's embeddings body -> (model, texts) (openai_answer reads `encoding_format`); AIError
    naming the field (5007 for a model that embeds nothing, with the names that do; 5006 for the
    rest). `names`: every name served."""
    if not isinstance(body, dict):
        raise AIError(INVALID, "the body must be a JSON object such as {'model': ..., 'input': [...]}")
    unknown = sorted(str(k) for k in body if k not in OPENAI_FIELDS)
    if unknown:
        raise AIError(
            INVALID, f"{unknown[0]}: unknown field; accepted: {', '.join(OPENAI_FIELDS)}", unknown[0]
        )
    model = body.get("model")
    embedding = ", ".join(EMBEDDING_MODELS)
    if not isinstance(model, str) or not is_embedding_model(model):
        what = "is a text generation model" if model in names else "is no model served here"
        raise AIError(5007, f"model: {model!r} {what}; the embedding models are {embedding}", "model")
    if body.get("encoding_format", "float") not in ("float", "base64"):
        raise AIError(
            INVALID, "encoding_format: send 'float' or 'base64' (or leave it out)", "encoding_format"
        )
    dims = body.get("dimensions")
    if dims is not None and dims != EMBEDDING_MODELS[model]:
        raise AIError(
            INVALID,
            f"dimensions: {model} answers in {EMBEDDING_MODELS[model]} dimensions; leave it out",
            "dimensions",
        )
    if "input" not in body:
        raise AIError(INVALID, "input: required (a string or a list of strings)", "input")
    return model, texts_of(body["input"], "input")
