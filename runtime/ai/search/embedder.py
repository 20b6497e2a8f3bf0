"""The embedding model an AI Search instance indexes and searches with.

Two embedders, one Protocol (`name`, `dimensions`, `embed(texts)` -> float32 rows of unit length):

- `HashedNgrams`: the runtime's lexical stand-in (runtime.ai.embeddings): words, word pairs and word
  pieces hashed into a vector; it knows no synonyms.
- `TrainedEmbedder`: "edge/ai-search-embedder-v1", shipped in the models folder
  (`ai-search-embedder/`: model.safetensors, config.json, training.json, heldout.json). Two
  channels, each unit length, concatenated: a LEARNED one, the sum of a trained table's rows for
  the text's vocabulary words (words of 5+ training documents), their character 3-5-grams and
  pairs of them, trained contrastively (models/recipe/train_embedder.py) so that a question and
  the passage that answers it land close even when they share no word; and a fixed LEXICAL one,
  every word and word pair (stop words a tenth, idf-weighted) sign-hashed into 512 dimensions,
  which matches what no training saw (a name, a number, any other word) as the stand-in does. The
  learned channel's share of the cosine is 1 - weight (0.7) for a text whose non-stop words are
  mostly vocabulary words, falling to 0 for a text of words the training never saw, which is then
  read lexically only. Features are hashed with crc32 into `buckets`; inference is numpy only (a
  cached look-up per word, one gather-and-sum, one scatter), about 1 ms for a 2 KB document.

  Its vocabulary is the generated corpus's lexicon (bench/ai_search_corpus.py) plus the chat
  corpus's words: it knows the synonyms of that lexicon and no others. On other text it is about
  the stand-in (the lexical channel carries it).

`default_embedder()` returns the trained model only when its recorded measurement on the held-out
benchmark (`heldout.json`, written by bench/ai_search_retrieval.py on the same questions for both)
shows it beating the stand-in on the paraphrased questions; else the stand-in. Nothing is downloaded.
"""

from __future__ import annotations

import functools
import json
import math
import re
import threading
import unicodedata
import zlib
from pathlib import Path
from typing import NamedTuple, Protocol

import numpy as np

from runtime.ai.embeddings import HASHED_NGRAMS, embed_text
from runtime.control.config_schema import INSTALLED_MODELS_DIR

TRAINED_NAME = "edge/ai-search-embedder-v1"
MODEL_FOLDER = "ai-search-embedder"
_WORD = re.compile(r"\w+", re.UNICODE)


class Embedder(Protocol):
    name: str
    dimensions: int

    def embed(self, texts: list[str]) -> np.ndarray: ...


class HashedNgrams:
    """The runtime's lexical stand-in (runtime.ai.embeddings): no synonyms."""

    name = HASHED_NGRAMS

    def __init__(self, dimensions: int = 768):
        self.dimensions = dimensions

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dimensions), dtype=np.float32)
        return np.stack([embed_text(t, self.dimensions) for t in texts]).astype(np.float32)


class Features(NamedTuple):
    learned_ids: np.ndarray  # buckets the learned channel reads (features of known words)
    learned_weights: np.ndarray
    lexical_ids: np.ndarray  # buckets the lexical channel reads (every word and word pair)
    lexical_weights: np.ndarray
    known_share: float  # of the text's non-stop words, the share in the vocabulary


def _weights(raw: dict[int, float]) -> tuple[np.ndarray, np.ndarray]:
    ids = np.fromiter(raw.keys(), dtype=np.int64, count=len(raw))
    weights = np.fromiter(
        (1.0 + math.log(r) if r >= 1.0 else r for r in raw.values()), dtype=np.float32, count=len(raw)
    )
    return ids, weights


class Featurizer:
    """A text's hashed features, as config.json's "features" describes them."""

    def __init__(self, spec: dict, vocabulary: frozenset[str] | None = None):
        self.buckets = int(spec["buckets"])
        self.word, self.pair, self.piece = (float(spec["weights"][k]) for k in ("word", "pair", "piece"))
        self.lo, self.hi = (int(n) for n in spec["char_ngrams"])
        self.min_piece_word = int(spec["min_piece_word"])
        self.stop_words = frozenset(spec["stop_words"])
        self.stop_weight = float(spec["stop_weight"])
        self.salt = str(spec.get("salt", ""))
        self.vocabulary = frozenset(spec.get("vocabulary") or ()) if vocabulary is None else vocabulary
        self._word_features = functools.lru_cache(maxsize=1 << 16)(self._word_features_uncached)

    def _slot(self, feature: str) -> int:
        return zlib.crc32((self.salt + feature).encode("utf-8", "surrogatepass")) % self.buckets

    def _word_features_uncached(self, word: str) -> tuple[int, tuple[int, ...]]:
        """The word's bucket and, for a vocabulary word of 4+ letters, its character n-grams'."""
        pieces: list[int] = []
        if word in self.vocabulary and word not in self.stop_words and len(word) >= self.min_piece_word:
            marked = f"<{word}>"
            for n in range(self.lo, self.hi + 1):
                pieces += [self._slot("c:" + marked[j : j + n]) for j in range(len(marked) - n + 1)]
        return self._slot("w:" + word), tuple(pieces)

    def features(self, text: str) -> Features:
        """Each channel's buckets once, a bucket's raw weight r (the sum of its features' family
        weights; a stop word's word and pair features x stop_weight) used as 1 + log r (r under 1).
        The lexical channel reads every word and word pair; the learned one a vocabulary word, its
        character n-grams, and a pair of two vocabulary words."""
        tokens = _WORD.findall(unicodedata.normalize("NFKC", text).casefold())
        learned: dict[int, float] = {}
        lexical: dict[int, float] = {}
        content = known_content = 0
        for i, word in enumerate(tokens):
            stop = word in self.stop_words
            known = word in self.vocabulary
            scale = self.stop_weight if stop else 1.0
            slot, pieces = self._word_features(word)
            lexical[slot] = lexical.get(slot, 0.0) + self.word * scale
            if known:
                learned[slot] = learned.get(slot, 0.0) + self.word * scale
                for piece in pieces:
                    learned[piece] = learned.get(piece, 0.0) + self.piece
            if not stop:
                content += 1
                known_content += known
            if i + 1 < len(tokens):
                pair = self._slot("b:" + word + " " + tokens[i + 1])
                lexical[pair] = lexical.get(pair, 0.0) + self.pair * scale
                if known and tokens[i + 1] in self.vocabulary:
                    learned[pair] = learned.get(pair, 0.0) + self.pair * scale
        share = known_content / content if content else 0.0
        return Features(*_weights(learned), *_weights(lexical), share)


def lexical_vector(ids: np.ndarray, weights: np.ndarray, dimensions: int, idf: np.ndarray) -> np.ndarray:
    """The lexical channel: the word and word-pair buckets, weighted by their idf, sign-hashed into
    `dimensions` (bucket mod dimensions, the sign from the next bit), unit length."""
    vector = np.zeros(dimensions, dtype=np.float32)
    signs = np.where((ids // dimensions) % 2 == 0, 1.0, -1.0).astype(np.float32)
    np.add.at(vector, ids % dimensions, signs * weights * idf[ids])
    norm = float(np.linalg.norm(vector))
    return vector / norm if norm > 0 else vector


def channel_scales(known_share: float, weight: float, shares: tuple[float, float]) -> tuple[float, float]:
    """(learned, lexical) scales of a text, squares summing to 1: the learned channel's share of the
    cosine is (1 - weight) for a text whose non-stop words are vocabulary words in at least
    shares[1], none at or below shares[0] (a text of words the training never saw is read
    lexically, as the stand-in reads it), linear between."""
    low, full = shares
    ramp = min(1.0, max(0.0, (known_share - low) / (full - low))) if full > low else 1.0
    learned = (1.0 - weight) * ramp
    return math.sqrt(learned), math.sqrt(1.0 - learned)


class TrainedEmbedder:
    """The learned channel beside the lexical one (module docstring)."""

    def __init__(self, folder: Path):
        from safetensors.numpy import load_file

        config = json.loads((folder / "config.json").read_text())
        self.name = str(config["name"])
        self.learned = int(config["learned_dimensions"])
        self.lexical = int(config["lexical"]["dimensions"])
        self.weight = float(config["lexical"]["weight"])
        self.shares = (float(config["lexical"]["low_share"]), float(config["lexical"]["full_share"]))
        self.dimensions = self.learned + self.lexical
        if int(config["dimensions"]) != self.dimensions:
            raise ValueError(
                f"{folder}: dimensions {config['dimensions']} != {self.learned} + {self.lexical}"
            )
        self.featurizer = Featurizer(config["features"])
        tensors = load_file(str(folder / "model.safetensors"))
        table = tensors["embedding"]
        if table.shape != (self.featurizer.buckets, self.learned):
            raise ValueError(
                f"{folder}: embedding {table.shape}, config says {(self.featurizer.buckets, self.learned)}"
            )
        self.table = table.astype(np.float32)
        self.idf = tensors["idf"].astype(np.float32)

    def embed(self, texts: list[str]) -> np.ndarray:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for i, text in enumerate(texts):
            f = self.featurizer.features(text)
            a, b = channel_scales(f.known_share, self.weight, self.shares)
            learned = f.learned_weights @ self.table[f.learned_ids] if len(f.learned_ids) else None
            norm = float(np.linalg.norm(learned)) if learned is not None else 0.0
            if norm > 0:
                out[i, : self.learned] = learned * (a / norm)
            else:
                b = 1.0
            if len(f.lexical_ids):
                out[i, self.learned :] = (
                    lexical_vector(f.lexical_ids, f.lexical_weights, self.lexical, self.idf) * b
                )
        return out


def model_folder() -> Path:
    return INSTALLED_MODELS_DIR / MODEL_FOLDER


def beats_stand_in(folder: Path) -> bool:
    """Whether heldout.json records the trained model beating the stand-in on the paraphrased
    questions (recall@5 of both on the same held-out questions, chunking and retrieval_type)."""
    try:
        record = json.loads((folder / "heldout.json").read_text())
        para = record["paraphrased"]
        return float(para["trained"]["recall@5"]) > float(para["stand_in"]["recall@5"])
    except (OSError, ValueError, KeyError, TypeError):
        return False


_lock = threading.Lock()


@functools.cache
def _trained(folder: Path) -> TrainedEmbedder:
    with _lock:
        return TrainedEmbedder(folder)


def trained_embedder(folder: Path | None = None) -> TrainedEmbedder:
    return _trained(folder or model_folder())


def default_embedder() -> Embedder:
    folder = model_folder()
    if (folder / "model.safetensors").is_file() and beats_stand_in(folder):
        return trained_embedder(folder)
    return HashedNgrams()


def embedder_named(name: str, dimensions: int) -> Embedder | None:
    """The embedder an instance was indexed with, by its name and width; None when it is not
    here (a trained model no longer shipped, or of another width): the instance is then indexed
    again with the default."""
    if name == HASHED_NGRAMS:
        return HashedNgrams(dimensions)
    if name == TRAINED_NAME and (model_folder() / "model.safetensors").is_file():
        found = trained_embedder()
        return found if found.dimensions == dimensions else None
    return None
