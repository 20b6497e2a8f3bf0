"""What the AI Gateway tests share: a counting stand-in for the AI service (every generation
counted, scripted failures first, a stream of Workers AI events), a clock the test moves, and a
Gateways over a temporary state dir."""

from __future__ import annotations

import asyncio
import json

from edge_sim.topology import Topology
from runtime.ai.call import AICall
from runtime.ai.gateway import GatewayOptions, Gateways
from runtime.ai.service import Answer
from runtime.control.fair_pool import FairPool
from workers import AIError

MODEL = "@edge/moonshotai/kimi-k2-mini"
POP = Topology.default().pop("ICN")


class CountingAI:
    """Answers each call with its running count; a stream is three events, a usage and [DONE].
    `fail`: codes raised first, one per call; `fail_mid_stream`: the next stream ends in an error."""

    def __init__(self, fail: list[int] | None = None, delay: float = 0.0):
        self.calls = 0
        self.fail = list(fail or [])
        self.delay = delay
        self.fail_mid_stream = False
        self.seen: list[AICall] = []

    async def answer(self, call: AICall) -> Answer:
        self.calls += 1
        self.seen.append(call)
        await asyncio.sleep(self.delay)
        if self.fail:
            raise AIError(self.fail.pop(0), "scripted failure")
        if isinstance(call.inputs, dict) and call.inputs.get("stream"):
            return Answer(stream=self._events(self.calls, self.fail_mid_stream))
        usage = {"prompt_tokens": 4, "completion_tokens": self.calls}
        return Answer(body={"response": f"answer {self.calls}", "usage": usage})

    @staticmethod
    async def _events(n: int, fail: bool):
        for i in range(3):
            yield f"data: {json.dumps({'response': f'{n}.{i}'})}\n\n".encode()
        if fail:
            yield b'data: {"error": "3040: the PoP went down mid-answer", "code": 3040}\n\n'
        else:
            usage = {"prompt_tokens": 4, "completion_tokens": 3}
            yield f"data: {json.dumps({'response': '', 'usage': usage})}\n\n".encode()
        yield b"data: [DONE]\n\n"


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Sleeps:
    """The retries' waits, recorded instead of waited."""

    def __init__(self):
        self.waited: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.waited.append(seconds)


def make_gateways(tmp_path, ai=None, **kw) -> Gateways:
    """A Gateways over `tmp_path` with a CountingAI, a Clock and recorded sleeps (gw.ai, gw.clock,
    gw.sleep); close it with close_gateways."""
    pool = FairPool(2, name="test-gateway")
    gw = Gateways(ai or CountingAI(), pool, tmp_path, clock=Clock(), sleep=Sleeps(), **kw)
    return gw


def close_gateways(gw: Gateways) -> None:
    gw.close()
    gw.pool.close()


def call(account="acct", inputs=None, model=MODEL, **made) -> AICall:
    """A Workers AI call as a door makes it; `made`: its request_id, tags, ..."""
    return AICall(model, inputs or {"prompt": "hi"}, account, None, POP, 5.0, **made)


def opts(**kw) -> GatewayOptions:
    return GatewayOptions.parse({"id": "gw", **kw})


def run(coro):
    return asyncio.run(coro)


async def read(stream) -> bytes:
    return b"".join([chunk async for chunk in stream])


def streamed(gw: Gateways, account: str = "acct", **kw):
    """A streamed call through gateway "gw", read to its end: (its GatewayAnswer, its bytes)."""

    async def go():
        through = await gw.run(call(account, {"prompt": "hi", "stream": True}), opts(**kw))
        return through, await read(through.answer.stream)

    return asyncio.run(go())
