"""Picks the GPU PoP for an AI call made at an ingress PoP.

The choice minimises the expected time to first token: the backbone RTT from the ingress, plus
the expected queue wait and this prompt's prefill at the PoP (`route_score`). PoPs that are down,
lack the model or are over their admission limit are skipped, and the call spills to the next
best; if none can take it, 3040. The capacity simulator ranks its replicas with the same
`route_score` over the same `PopLoad`, so simulated routing is the live router's.
"""

from __future__ import annotations

from typing import NamedTuple

from edge_sim.errors import EdgeError
from edge_sim.network import NetworkModel
from edge_sim.node import PopNodeLike
from edge_sim.topology import PoP


class PopLoad(NamedTuple):
    """What routing knows of one engine at a PoP now."""

    step_ms: float  # the step in progress (0 when idle): a newcomer waits for it
    pending_tokens: float  # prompt tokens queued or still prefilling there
    prefill_ms_per_token: float
    waiting: int  # requests not yet admitted
    seats: float  # more sequences it can admit now (sequence cap or KV room)
    finish_per_ms: float  # its recent rate of finished requests (> 0)


def expected_wait_ms(load: PopLoad) -> float:
    """A newcomer waits for the step in progress, for the prefill queued ahead of it, and, when more
    requests wait than there are seats, for that many finishes."""
    wait = load.step_ms + load.pending_tokens * load.prefill_ms_per_token
    if load.waiting > load.seats:
        wait += (load.waiting - load.seats) / load.finish_per_ms
    return wait


def route_score(backbone_rtt_ms: float, load: PopLoad, prompt_tokens: int) -> float:
    """Expected time to the first token through this PoP, network included (lower is better)."""
    return backbone_rtt_ms + expected_wait_ms(load) + prompt_tokens * load.prefill_ms_per_token


class Router:
    def __init__(self, network: NetworkModel, nodes: dict[str, PopNodeLike]):
        self.network = network
        self.nodes = nodes

    def candidates(
        self, model: str, ingress: PoP, prompt_tokens: int = 0, exclude: frozenset[str] = frozenset()
    ) -> list[tuple[PopNodeLike, float]]:
        """PoPs that can take the call, best first, each with its backbone RTT from the ingress."""
        serving = [n for n in self.nodes.values() if n.serves(model)]
        if not serving:
            raise EdgeError("model_not_found", f"no PoP serves {model!r}")
        open_ = [n for n in serving if n.has_room() and n.code not in exclude]
        if not open_:
            states = ", ".join(f"{n.code} {'full' if n.up else 'down'}" for n in serving)
            raise EdgeError("no_capacity", f"no PoP can take {model!r} now ({states}); retry later")
        ranked = []
        for node in open_:
            rtt = self.network.backbone_rtt_ms(ingress, node.pop)
            ranked.append((rtt + node.expected_ttft_ms(model, prompt_tokens), node.code, node, rtt))
        ranked.sort(key=lambda item: (item[0], item[1]))
        return [(node, rtt) for _, _, node, rtt in ranked]

    def choose(self, model: str, ingress: PoP, prompt_tokens: int = 0) -> tuple[PopNodeLike, float]:
        return self.candidates(model, ingress, prompt_tokens)[0]
