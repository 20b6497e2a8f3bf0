"""The decode step as one compiled graph per batch bucket (torch.compile, inductor).

An eager decode step of a miniature is about a thousand ATen calls of a few microseconds each;
compiled, the norms, RoPE, attention over the paged cache, the router and the dense matmuls of
all layers become a few fused C++ kernels. What a graph cannot hold stays eager as opaque ops
(engine.models.eager_ops: the routed experts, which read their token counts on the host, and
compressed-weight matmuls in C).

Shapes are bounded so compiles are counted, not open-ended: the batch is padded to a bucket
(1, 2, 4, ... 64 rows; padding rows write to the cache's scratch block) and the context is one
dynamic dimension (blocks per sequence), so each bucket compiles once, whatever the lengths. The
KV addressing is kernels.paged_kv_static's: every field a tensor, no branch on data.

Only decode-only steps on a CPU take this path; prefill chunks and speculative verify steps run
the eager model, which stays the reference (tests/unit/test_compiled_step.py checks both give the
same tokens). $EDGE_COMPILE=0 turns it off. Compiled artifacts persist in inductor's cache under
the user cache dir, so a second start reuses them.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterable
from pathlib import Path

import torch

from engine.kv.block_pool import BLOCK_SIZE
from engine.models import eager_ops
from engine.step.graph_key import graph, structure_key
from kernels.paged_kv_static import StaticDecodeIndex, static_index

log = logging.getLogger(__name__)

# one compile at a time in a process: several engines (PoPs, models) warm up on few cores
_COMPILING = threading.Lock()

COMPILE_ENV = "EDGE_COMPILE"
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# buckets a PoP compiles and serves compiled by default: measured (bench/compiled_step.py), the
# graph wins up to 16 sequences and is even at 32, where the step is mostly matmuls either way
DEFAULT_MAX_ROWS = 16


def compile_from_env(device: torch.device) -> bool:
    """$EDGE_COMPILE: "0" / "off" eager, "1" / "on" compiled; unset: compiled on a CPU."""
    value = os.environ.get(COMPILE_ENV, "").strip().lower()
    if value in ("0", "off", "false", "no"):
        return False
    if value in ("1", "on", "true", "yes"):
        return True
    return device.type == "cpu"


def _cache_dir() -> Path:
    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return base / "edge-workers" / f"inductor-torch-{torch.__version__}"


def row_bucket(n: int) -> int | None:
    """The smallest bucket holding n rows; None past the largest."""
    return next((b for b in ROW_BUCKETS if b >= n), None)


class _CompiledBatch:
    """What the model's layers ask a step batch for, on a compiled step: every row decodes."""

    decode_only = True

    def __init__(self, layers, index: StaticDecodeIndex):
        self.layers = layers
        self.index = index
        self.decode = self  # LayerKV.decode_write and the attention read `decode.index`
        self.real_rows = index.real_rows  # the fused MoE op skips (and does not count) padding rows

    def kv(self, layer: int):
        return self.layers[layer]


class CompiledDecode:
    """Decode-only steps through a compiled forward, for the batch buckets compiled so far;
    `warm_up()` compiles those up to `max_rows` unless given others (larger batches run eagerly)."""

    def __init__(
        self, model, cache, device: torch.device, max_rows: int = DEFAULT_MAX_ROWS, mtp: bool = False
    ):
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(_cache_dir()))
        # compile in this process, one C++ job at a time: a core stays with serving
        os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        # one graph per row bucket per engine; many engines live in one process (tests, PoPs)
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 1024)
        torch._dynamo.config.accumulated_recompile_limit = max(
            torch._dynamo.config.accumulated_recompile_limit, 4096
        )
        # rows stay each bucket's own: a graph is never recompiled dynamic in the batch (set once for
        # the process, not patched per call: dynamo's config is process-wide, and warm-up threads
        # compile while steps run)
        torch._dynamo.config.automatic_dynamic_shapes = False
        self.model, self.cache, self.device = model, cache, device
        self.max_rows = max_rows
        self.ready: set[int] = set()  # row buckets whose graph is compiled
        # `mtp`: the model's MTP layer (MTP drafts, engine.step.mtp_drafts) gets a graph per bucket too
        self.mtp = model.mtp if mtp else None
        # what dynamo's guards would check on every call, checked once here (engine.step.graph_key)
        self.key = structure_key(model, cache.layers, self.mtp is not None)
        self.mtp_ready: set[int] = set()  # buckets whose MTP-layer graph and greedy graph are compiled
        self.compile_seconds: dict[int, float] = {}
        self.failed: str | None = None  # why compiling failed (then every step runs eagerly)
        self.warming: threading.Thread | None = None  # warm_up_in_background's compiles
        self.steps = 0  # steps served compiled
        self.greedy_steps = 0  # of those, greedy steps that drafted the next step inside the graph

    # --- the graph -----------------------------------------------------------------------------

    def _forward(self, ids: torch.Tensor, index: StaticDecodeIndex, layers) -> torch.Tensor:
        return self.model.forward(ids, index.pos, _CompiledBatch(layers, index))

    def _mtp_forward(self, hidden: torch.Tensor, ids: torch.Tensor, index: StaticDecodeIndex, layers):
        assert self.mtp is not None
        return self.mtp.forward(hidden, ids, index.pos, _CompiledBatch(layers, index))

    def _greedy_forward(self, ids: torch.Tensor, index: StaticDecodeIndex, layers):
        """A greedy step with its next drafts in one graph: the decoder's rows, their logits and
        argmax, then the MTP layer's row at each position with that argmax as the next token (for
        a greedy sequence the token it emits there, whenever the row is kept) and its argmax,
        the draft that follows. Rows past a rejected draft write the MTP layer's cache at
        positions the next step writes again."""
        assert self.mtp is not None
        batch = _CompiledBatch(layers, index)
        hidden = self.model.forward(ids, index.pos, batch)
        logits = self.model.logits(hidden)
        best = logits.argmax(dim=-1)
        drafts = self.mtp.logits(self.mtp.forward(hidden, best, index.pos, batch)).argmax(dim=-1)
        return hidden, logits, best, drafts

    @staticmethod
    def _mark(index: StaticDecodeIndex) -> None:
        # the context (blocks per row) is the one dynamic dimension: one graph per row bucket
        for t, dim in ((index.tables, 1), (index.blocks, 0), (index.mask, 2)):
            torch._dynamo.mark_dynamic(t, dim)

    def _call(self, ids: torch.Tensor, index: StaticDecodeIndex) -> torch.Tensor:
        self._mark(index)
        return graph(self.key, CompiledDecode._forward, index.batch)(self, ids, index, self.cache.layers)

    def _call_mtp(self, hidden: torch.Tensor, ids: torch.Tensor, index: StaticDecodeIndex) -> torch.Tensor:
        assert self.mtp is not None
        self._mark(index)
        fn = graph(self.key, CompiledDecode._mtp_forward, index.batch)
        return fn(self, hidden, ids, index, self.cache.layers)

    def _call_greedy(self, ids: torch.Tensor, index: StaticDecodeIndex):
        assert self.mtp is not None
        self._mark(index)
        return graph(self.key, CompiledDecode._greedy_forward, index.batch)(
            self, ids, index, self.cache.layers
        )

    def _index(self, tables: list[list[int]], pos: list[int], slots: list[int | None], rows: int):
        blocks = max(2, max(len(t) for t in tables))  # at least 2: the dynamic dim's minimum
        scratch_slot = self.cache.scratch_slot
        return static_index(
            tables,
            pos,
            [scratch_slot if s is None else s for s in slots],
            rows,
            blocks,
            self.cache.scratch_block,
            scratch_slot,
            self.device,
        )

    # --- serving -------------------------------------------------------------------------------

    def accepts(self, rows: int) -> bool:
        """Whether a decode-only step of `rows` sequences runs compiled now (its bucket is ready)."""
        if self.failed is not None:
            return False
        bucket = row_bucket(rows)
        return bucket is not None and bucket in self.ready

    def accepts_mtp(self, rows: int) -> bool:
        """Whether the MTP layer's rows (one token each) run compiled now."""
        bucket = row_bucket(rows)
        return self.failed is None and bucket is not None and bucket in self.mtp_ready

    def _padded(self, ids: list[int], slices) -> tuple[torch.Tensor, StaticDecodeIndex, int]:
        rows = row_bucket(len(ids))
        assert rows is not None
        tables, pos = [], []
        for s in slices:
            needed = -(-(s.past + 1) // BLOCK_SIZE)
            tables.append(s.blocks.block_table[:needed])
            pos.append(s.past)
        index = self._index(tables, pos, [s.blocks.slot for s in slices], rows)
        ids_t = torch.tensor(ids + [0] * (rows - len(ids)), dtype=torch.long, device=self.device)
        return ids_t, index, rows

    def decode(self, ids: list[int], slices) -> torch.Tensor:
        """Final hidden states [B, hidden] of B decoding rows' tokens `ids`, one
        engine.kv.batch.SeqSlice each (a speculating sequence has a row per token verified)."""
        ids_t, index, _ = self._padded(ids, slices)
        self.steps += 1
        # every guard is evaluated (about 0.2 ms a step at batch 1): torch's stance that skips most of
        # them is process-wide, and another thread may be compiling a bucket meanwhile
        with eager_ops.step(self.model.eager_parts, len(ids)):
            return self._call(ids_t, index)[: len(ids)]

    def greedy_decode(self, ids: list[int], slices) -> tuple[torch.Tensor, ...]:
        """For B greedy decoding rows: (hidden [B, h], logits [B, V] float32, argmax [B], the MTP
        layer's draft after each row's argmax [B]); engine.engine uses it when every sequence of a
        decode-only step is greedy without biases or grammars."""
        ids_t, index, _ = self._padded(ids, slices)
        self.steps += 1
        self.greedy_steps += 1
        with eager_ops.step(self.model.eager_parts, len(ids)):
            out = self._call_greedy(ids_t, index)
        return tuple(t[: len(ids)] for t in out)

    def mtp_decode(self, hidden: torch.Tensor, ids: list[int], slices) -> torch.Tensor:
        """The MTP layer's normed output [B, hidden] for B rows (hidden state, next token), one
        single-token engine.kv.batch.SeqSlice each."""
        ids_t, index, rows = self._padded(ids, slices)
        if rows > len(ids):
            hidden = torch.cat([hidden, hidden.new_zeros(rows - len(ids), hidden.shape[1])])
        assert self.mtp is not None
        with eager_ops.step(self.model.eager_parts, len(ids)):
            return self._call_mtp(hidden, ids_t, index)[: len(ids)]

    def warm_up(self, buckets: Iterable[int] | None = None) -> None:
        """Compile the graph of each row bucket (all rows padding: only the scratch block is
        written), smallest first; a failure turns the compiled path off and says why."""
        for rows in buckets if buckets is not None else ROW_BUCKETS:
            if (buckets is None and rows > self.max_rows) or rows in self.ready or self.failed is not None:
                continue
            try:
                with _COMPILING, torch.inference_mode():
                    started = time.perf_counter()
                    for blocks in (2, 3):  # a second length: the context dim compiles dynamic at once
                        index = static_index(
                            [],
                            [],
                            [],
                            rows,
                            blocks,
                            self.cache.scratch_block,
                            self.cache.scratch_slot,
                            self.device,
                        )
                        ids = torch.zeros(rows, dtype=torch.long, device=self.device)
                        with eager_ops.step(self.model.eager_parts, 0):
                            self._call(ids, index)
                        if self.mtp is not None:
                            hidden = torch.zeros(rows, self.model.config.hidden_size, device=self.device)
                            with eager_ops.step(self.model.eager_parts, 0):
                                self._call_mtp(hidden.to(self.model.dtype), ids, index)
                                self._call_greedy(ids, index)
            except Exception as exc:  # noqa: BLE001 - any compiler failure: serve eagerly
                self.failed = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                log.warning("compiled decode step unavailable, serving eagerly: %s", self.failed)
                return
            self.compile_seconds[rows] = time.perf_counter() - started
            self.ready.add(rows)
            if self.mtp is not None:
                self.mtp_ready.add(rows)
            log.info("compiled decode step: %d-row bucket ready in %.1f s", rows, self.compile_seconds[rows])

    def warm_up_in_background(self, buckets: Iterable[int] | None = None) -> threading.Thread:
        """warm_up on a daemon thread at a lower CPU priority: steps run eagerly until their bucket
        is ready, and serving keeps the CPU first while compiles run."""

        def run() -> None:
            try:
                os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)  # this thread only (Linux)
            except (AttributeError, OSError):
                pass
            self.warm_up(buckets)

        thread = threading.Thread(target=run, name="edge-compile", daemon=True)
        thread.start()
        self.warming = thread
        return thread

    def wait_warm(self) -> None:
        """Until warm_up_in_background's compiles have ended (at once when none was started)."""
        if self.warming is not None:
            self.warming.join()
