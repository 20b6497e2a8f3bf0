"""The embedding model an AI Search instance indexes and searches with (the retrieval helper
replaces default_embedder with the trained model once it beats the stand-in)."""

from __future__ import annotations

from typing import Protocol

import numpy as np

from runtime.ai.embeddings import HASHED_NGRAMS, embed_text


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


def default_embedder() -> Embedder:
    return HashedNgrams()
