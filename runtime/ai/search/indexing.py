"""Indexing one item: its bytes to Markdown (the converter env.AI.toMarkdown uses, plus PDF through
pypdf), the Markdown to chunks (chunking), each chunk embedded (the instance's embedder) and
written with its keyword index entry, in one transaction that replaces the item's old chunks.

`index_item` is a generator: each stage is a turn of the fair pool (runtime.control.fair_pool),
so a flood of one account's documents takes turns with other accounts' searches and uploads. A
document that cannot be converted ends `error` with its reason; the next one goes on.
"""

from __future__ import annotations

import io
import mimetypes
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from runtime.ai.search import chunking
from runtime.ai.search.embedder import Embedder
from runtime.ai.search.store import SearchStore
from workers import markdown

MAX_CHUNKS = 100_000  # per instance
EMBED_BATCH = 32
PDF = "application/pdf"


def to_markdown(key: str, content_type: str, data: bytes) -> str:
    """The item's Markdown; ValueError with the reason when it cannot be converted."""
    mime = markdown.mime_type_of(
        key, None if content_type in ("", "application/octet-stream") else content_type
    )
    if mime == "application/octet-stream":  # named for the error: "image/png cannot be converted"
        mime = mimetypes.guess_type(key)[0] or mime
    if mime == PDF or key.lower().endswith(".pdf"):
        return _pdf(key, data)
    result = markdown.convert(key, mime, data)
    if result.get("format") == "error":
        raise ValueError(result.get("error") or f"{key}: cannot be converted")
    return result["data"]


def _pdf(key: str, data: bytes) -> str:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        pages = [(page.extract_text() or "").strip() for page in reader.pages]
    except (PdfReadError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{key}: not a PDF that can be read ({str(exc)[:200]})") from None
    text = "\n\n".join(p for p in pages if p)
    if not text:
        raise ValueError(f"{key}: the PDF holds no text (scanned pages need OCR, which is not here)")
    return text + "\n"


def index_item(
    store: SearchStore,
    embedder: Embedder,
    account: str,
    ns: str,
    instance: str,
    item_id: str,
    settings: dict[str, Any],
) -> Iterator[None]:
    """Index one claimed (status 'running') item; ends with its status completed or error. Its
    result: (status, chunks written, error or None)."""
    row = store.one(
        "SELECT key, content_type, content FROM items WHERE id = ? AND account = ? AND status = 'running'",
        (item_id, account),
    )
    if row is None:  # deleted (or re-queued) meanwhile
        return ("skipped", 0, None)
    key, content_type, content = row[0], row[1], bytes(row[2])
    yield
    try:
        text = to_markdown(key, content_type, content)
    except ValueError as exc:
        _finish(store, item_id, "error", None, str(exc))
        return ("error", 0, str(exc))
    yield
    if settings.get("chunk", True):
        pieces = chunking.chunk_markdown(
            text, settings["chunk_size"], settings["chunk_overlap"], chunking.title_of(text, key)
        )
    else:
        pieces = [chunking.Chunk(0, text.strip(), chunking.title_of(text, key))] if text.strip() else []
    if not pieces:
        _finish(store, item_id, "completed", 0, None)
        return ("completed", 0, None)
    held = store.chunk_count(account, ns, instance)
    old = store.one("SELECT count(*) FROM chunks WHERE item_id = ?", (item_id,))[0]
    if held - old + len(pieces) > MAX_CHUNKS:
        why = f"the instance would hold over {MAX_CHUNKS} chunks; delete items or use a larger chunk_size"
        _finish(store, item_id, "error", None, why)
        return ("error", 0, why)
    vectors: list[np.ndarray] = []
    for start in range(0, len(pieces), EMBED_BATCH):
        yield
        batch = pieces[start : start + EMBED_BATCH]
        vectors.append(embedder.embed([f"{p.context}\n{p.text}" if p.context else p.text for p in batch]))
    matrix = np.concatenate(vectors).astype(np.float32)
    yield
    with store.transaction() as db:
        still = db.execute("SELECT status FROM items WHERE id = ?", (item_id,)).fetchone()
        if still is None or still[0] != "running":
            return ("skipped", 0, None)
        db.execute("DELETE FROM chunks WHERE item_id = ?", (item_id,))
        db.executemany(
            "INSERT INTO chunks (account, namespace, instance, item_id, seq, text, context, vec) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (account, ns, instance, item_id, p.seq, p.text, p.context, matrix[i].tobytes())
                for i, p in enumerate(pieces)
            ],
        )
        db.execute(
            "UPDATE items SET status = 'completed', error = NULL, chunks_count = ?, modified = "
            "? WHERE id = ?",
            (len(pieces), time.time(), item_id),
        )
        store.bump(db, account, ns, instance)
    return ("completed", len(pieces), None)


def _finish(store: SearchStore, item_id: str, status: str, chunks: int | None, error: str | None) -> None:
    with store.transaction() as db:
        db.execute("DELETE FROM chunks WHERE item_id = ?", (item_id,))
        db.execute(
            "UPDATE items SET status = ?, error = ?, chunks_count = ?, modified = ? WHERE id = "
            "? AND status = 'running'",
            (status, error[:1000] if error else None, chunks, time.time(), item_id),
        )
        row = db.execute("SELECT account, namespace, instance FROM items WHERE id = ?", (item_id,)).fetchone()
        if row is not None:
            store.bump(db, *row)
