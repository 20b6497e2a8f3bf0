"""Our engine's own step times, measured on the machine that runs it, as a capacity cost model.

`ProfiledCostModel.profile` drives an engine through prefill and decode steps (prefill time per
token and per attention pair; decode step time per batch size and cached context) and fits
`ProfileFit`; the result is saved to a JSON file and reused. `fit_serving_steps` fits the same
formulas to the steps an engine recorded while it served (EDGE_STEP_LOG), which include what a
standalone profile misses: the serving process around the engine. Each GPU PoP then runs one
engine like the one profiled (the same KV budget and scheduler limits), priced as one GPU of the
PoP's type.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec

from capacity.costmodel import ReplicaPlan, _pick_gpu
from capacity.profile_fit import ProfileFile, ProfileFit, least_squares
from edge_sim.roofline import SimulationError, check_kv, gpu_type

__all__ = ["ProfileFile", "ProfileFit", "ProfiledCostModel"]


def _prompt(n: int, vocab: int, salt: int) -> list[int]:
    # Distinct token ids away from the specials at the bottom of the vocabulary.
    span = max(1, vocab - 16)
    return [16 + (salt * 7919 + i * 31) % span for i in range(n)]


class _ServingLoop:
    """An asyncio loop in its own thread that receives every step's token events the way a PoP
    does (call_soon_threadsafe into a queue that a coroutine drains). Steps measured beside it pay
    the same interpreter contention as the steps `edge dev` serves, about 15-20% on a CPU, which
    a profile taken alone would leave out."""

    def __enter__(self) -> _ServingLoop:
        import asyncio
        import threading

        self.loop = asyncio.new_event_loop()
        ready = threading.Event()

        async def consume() -> None:
            self.queue: asyncio.Queue = asyncio.Queue()
            ready.set()
            texts = []
            while True:
                event = await self.queue.get()
                texts.append(event.text)
                if len(texts) > 4096:
                    texts.clear()

        def run() -> None:
            asyncio.set_event_loop(self.loop)
            self.task = self.loop.create_task(consume())
            self.loop.run_forever()

        self.thread = threading.Thread(target=run, name="profile-serving-loop", daemon=True)
        self.thread.start()
        ready.wait()
        return self

    def deliver(self, events) -> None:
        for event in events:
            self.loop.call_soon_threadsafe(self.queue.put_nowait, event)

    def __exit__(self, *exc) -> None:
        import asyncio
        import contextlib

        async def shutdown() -> None:
            self.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self.task
            self.loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), self.loop)
        self.thread.join(timeout=10)
        self.loop.close()


def _step(engine, sink: _ServingLoop | None = None):
    """One engine step; its StepStats, or None when there was nothing to run."""
    last = engine.steps[-1] if engine.steps else None
    events = engine.step()
    if sink is not None:
        sink.deliver(events)
    new = engine.steps[-1] if engine.steps else None
    return new if new is not last else None


def _all_decoding(sched) -> Callable[[], bool]:
    return lambda: not sched.waiting and all(s.remaining == 1 for s in sched.running)


def _run_until(
    engine, done: Callable[[], bool], sink: _ServingLoop | None = None, limit: int = 100000
) -> None:
    for _ in range(limit):
        if done():
            return
        _step(engine, sink)
    raise SimulationError("profiling did not converge (the engine never reached the wanted state)")


class ProfiledCostModel:
    """Our engine's step times, measured on this machine; one `ProfileFit` per KV dtype."""

    name = "profiled"

    def __init__(
        self,
        model: str,
        device: str,
        fits: dict[str, ProfileFit],
        threads: int = 0,
        prices: dict[str, float] | None = None,
    ):
        self.model_name, self.device, self.fits, self.threads = model, device, dict(fits), threads
        self.prices = dict(prices or {})

    def describe(self) -> str:
        return f"profiled: {self.model_name} on {self.device} ({', '.join(self.fits)})"

    # -- measurement --

    @classmethod
    def profile(
        cls,
        llm: Any,
        batch_sizes: Sequence[int] = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32),
        contexts: Sequence[int] = (128, 512, 2048),
        prompt_lengths: Sequence[int] = (32, 64, 128, 256, 512, 1024),
        *,
        steps_per_point: int = 3,
        max_prefill_tokens: int = 24576,
        serving: bool = True,
        compiled: bool = True,
    ) -> ProfiledCostModel:
        """Measure `llm` (an engine.LLM): prefill steps for each prompt length, decode steps for
        each batch size at each context (batch x context capped at `max_prefill_tokens` so that
        profiling stays quick), then fit the models of ProfileFit. `serving`: deliver each step's
        events to an event loop in another thread, as a PoP does (see _ServingLoop). `compiled`:
        compile the engine's decode buckets first (engine.step.compiled_step), as a PoP does before it
        serves, so that decode steps are measured as they are served (unwarmed, every step ran
        eagerly: on a CPU the compiled graph's cost per added row differs); False measures eager
        steps, quicker where nothing is compiled yet."""
        graph = getattr(llm.engine, "compiled_decode", None)
        if compiled and graph is not None:
            graph.warm_up()
        sink = _ServingLoop().__enter__() if serving else None
        try:
            return cls._profile(
                llm, batch_sizes, contexts, prompt_lengths, steps_per_point, max_prefill_tokens, sink
            )
        finally:
            if sink is not None:
                sink.__exit__(None, None, None)

    @classmethod
    def _profile(
        cls, llm, batch_sizes, contexts, prompt_lengths, steps_per_point, max_prefill_tokens, sink
    ) -> ProfiledCostModel:
        import torch

        from engine import SamplingParams

        started = time.perf_counter()
        eng = llm.engine
        cache = eng.cache
        cfg = eng.scheduler.config
        vocab = llm.config.vocab_size
        window = llm.context_window
        if eng.has_unfinished():
            raise SimulationError("profile an idle engine: this one has requests in flight")
        salt = [0]

        def add(n: int, max_tokens: int) -> str:
            salt[0] += 1
            params = SamplingParams(max_tokens=max_tokens, temperature=0, ignore_eos=True)
            return eng.add_request(_prompt(n, vocab, salt[0]), params)

        def drain() -> None:
            _run_until(eng, lambda: not eng.has_unfinished(), sink)

        # Warm-up: first calls allocate and pick kernels.
        for n in (min(32, window // 4), min(max(prompt_lengths), window // 2)):
            add(n, 4)
            drain()

        prefill_points: list[tuple[int, float, float]] = []
        budget = cfg.max_num_batched_tokens
        for n in prompt_lengths:
            n = min(int(n), window - 2)
            chunks = [(s, min(budget, n - s)) for s in range(0, n, budget)]
            samples: dict[int, list[float]] = {}
            for _ in range(3):
                add(n, 1)
                i = 0
                while eng.has_unfinished():
                    st = _step(eng, sink)
                    if st is not None and st.prefill_tokens and i < len(chunks):
                        samples.setdefault(i, []).append(st.duration_ms)
                        i += 1
            for i, (s, c) in enumerate(chunks):
                if i in samples:
                    prefill_points.append((c, c * (s + (c + 1) / 2), statistics.median(samples[i])))

        decode_points: list[tuple[int, int, float]] = []
        for ctx in contexts:
            ctx = max(1, min(int(ctx), window // 2))
            top = min(max(batch_sizes), cfg.max_num_seqs, max(1, max_prefill_tokens // ctx))
            sizes = sorted({b for b in batch_sizes if b <= top} or {1}, reverse=True)
            # enough tokens to outlast the other sequences' prefill and every measurement
            extra = -(-sizes[0] * ctx // budget) + (steps_per_point + 1) * len(sizes) + 8
            extra = min(extra, window - ctx - 1)
            per_seq = cache.blocks_for(ctx + extra) + cache.staging_blocks
            fit = max(1, cache.num_blocks // max(1, per_seq))
            sizes = [b for b in sizes if b <= fit] or [1]
            ids = [add(ctx, extra) for _ in range(sizes[0])]
            _run_until(eng, _all_decoding(eng.scheduler), sink)
            for b in sizes:
                while len(ids) > b:
                    eng.abort(ids.pop())
                _step(eng, sink)  # settle after the aborts
                times, kv = [], 0
                for _ in range(steps_per_point):
                    kv = sum(s.num_computed + 1 for s in eng.scheduler.running)
                    st = _step(eng, sink)
                    if st is not None and not st.prefill_tokens and st.batch_size == b:
                        times.append(st.duration_ms)
                if times:
                    decode_points.append((b, kv, statistics.median(times)))
            for rid in ids:
                eng.abort(rid)
            drain()

        if not decode_points or not prefill_points:
            raise SimulationError(
                "profiling measured nothing; give at least one batch size, context and prompt"
            )
        dfit = least_squares(
            [[1.0, b, kv / 1e3] for b, kv, _ in decode_points], [ms for *_, ms in decode_points]
        )
        # per batch size an intercept, one shared slope per cached token (see ProfileFit)
        measured = sorted({b for b, _, _ in decode_points})
        table = least_squares(
            [[float(b == m) for m in measured] + [kv / 1e3] for b, kv, _ in decode_points],
            [ms for *_, ms in decode_points],
        )
        kv_slope = table[-1]
        if len(decode_points) <= len(measured):  # one point per batch size: keep the line's slope
            kv_slope = dfit[2]
            table = [
                statistics.mean(ms - kv_slope * kv / 1e3 for b, kv, ms in decode_points if b == m)
                for m in measured
            ]
        pfit = least_squares(
            [[1.0, p, pairs / 1e6] for p, pairs, _ in prefill_points], [ms for *_, ms in prefill_points]
        )
        fit = ProfileFit(
            kv=llm.kv_cache_dtype,
            decode_fixed_ms=dfit[0],
            decode_seq_ms=dfit[1],
            decode_kv_ms_per_1k=kv_slope,
            decode_batch_ms=[(b, t) for b, t in zip(measured, table, strict=False)],
            prefill_fixed_ms=pfit[0],
            prefill_token_ms=pfit[1],
            prefill_pair_ms_per_1m=pfit[2],
            kv_bytes_per_token=cache.bytes_per_token(),
            block_bytes=int(cache.block_bytes),
            num_blocks=int(cache.num_blocks),
            staging_blocks=int(cache.staging_blocks),
            max_num_seqs=cfg.max_num_seqs,
            max_batched_tokens=cfg.max_num_batched_tokens,
            context_window=window,
            decode_points=decode_points,
            prefill_points=prefill_points,
            seconds=time.perf_counter() - started,
        )
        device = str(llm.device)
        if llm.device.type == "cpu":
            device = f"cpu x{torch.get_num_threads()} threads"
        graph = getattr(eng, "compiled_decode", None)
        if graph is not None and graph.ready:
            device += f", decode compiled up to {max(graph.ready)} rows"
        return cls(llm.path.name, device, {fit.kv: fit}, torch.get_num_threads())

    def merged(self, other: ProfiledCostModel) -> ProfiledCostModel:
        if other.model_name != self.model_name:
            raise SimulationError(f"cannot merge profiles of {self.model_name} and {other.model_name}")
        return ProfiledCostModel(self.model_name, self.device, {**self.fits, **other.fits}, self.threads)

    @classmethod
    def ensure(
        cls,
        path: str | Path,
        model_dir: str | Path,
        kvs: Sequence[str],
        *,
        existing: ProfiledCostModel | None = None,
        device: str = "cpu",
        threads: int | None = 1,
        log: Callable[[str], None] | None = None,
        **profile_kwargs: Any,
    ) -> ProfiledCostModel:
        """The profile at `path`, with every KV dtype in `kvs` measured (the missing ones now, on
        `device`, each with the same KV byte budget as `auto`) and saved back.

        `threads`: torch CPU threads while measuring (None: leave as is). One thread is the
        default because a CPU shared with other work makes multi-threaded step times erratic
        (threads spin waiting for each other); the profile records the count it ran with."""
        import torch

        for kv in kvs:
            check_kv(kv)
        cost = existing
        missing = [kv for kv in kvs if cost is None or kv not in cost.fits]
        saved_threads = torch.get_num_threads()
        if threads and missing:
            torch.set_num_threads(threads)
        try:
            cost = cls._measure_missing(model_dir, missing, cost, device, log, path, profile_kwargs)
        finally:
            torch.set_num_threads(saved_threads)
        if cost is None:
            raise SimulationError("no KV dtype to profile")
        if missing:
            cost.save(path)
        return cost

    @classmethod
    def _measure_missing(cls, model_dir, missing, cost, device, log, path, profile_kwargs):
        from engine import LLM

        budget = None
        for kv in missing:
            if log:
                log(f"profiling {Path(model_dir).name} with KV {kv} on {device} (saved to {path})")
            if budget is None:
                probe = LLM(model_dir, device=device)
                budget = probe.engine.cache.num_blocks * probe.engine.cache.block_bytes
                del probe
            llm = LLM(model_dir, device=device, kv_cache_dtype=kv, kv_cache_bytes=budget)
            measured = cls.profile(llm, **profile_kwargs)
            cost = measured if cost is None else cost.merged(measured)
        return cost

    # -- persistence --

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        data = ProfileFile(model=self.model_name, device=self.device, threads=self.threads, fits=self.fits)
        p.write_bytes(msgspec.json.format(msgspec.json.encode(data), indent=2) + b"\n")
        return p

    @classmethod
    def load(cls, path: str | Path) -> ProfiledCostModel:
        p = Path(path)
        try:
            data = msgspec.json.decode(p.read_bytes(), type=ProfileFile)
        except FileNotFoundError:
            raise SimulationError(f"{p}: profile not found") from None
        except msgspec.DecodeError as exc:
            raise SimulationError(f"{p}: not a profile file: {exc}") from None
        return cls(data.model, data.device, data.fits, data.threads)

    # -- the simulator's view --

    def plan_pop(self, gpus: dict[str, int], kv: str, min_kv_tokens: int) -> ReplicaPlan:
        fit = self.fits.get(kv)
        if fit is None:
            raise SimulationError(
                f"the profile of {self.model_name} has no KV dtype {kv!r} (it has {', '.join(self.fits)}); "
                f"profile it first"
            )
        name, _ = _pick_gpu(gpus)
        gpu = gpu_type(name, self.prices)
        return ReplicaPlan(
            gpu=name,
            gpus=1,
            replicas=1,
            num_blocks=fit.num_blocks,
            staging_blocks=fit.staging_blocks,
            block_bytes=fit.block_bytes,
            max_num_seqs=fit.max_num_seqs,
            max_batched_tokens=fit.max_batched_tokens,  # the policy caps seats at it, as live
            max_context=fit.context_window,
            price_per_hour=gpu.price_per_hour,
            step_ms=fit.step_ms,
            decode_ms=fit.decode_ms,
        )
