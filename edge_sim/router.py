"""Picks the GPU PoP for an AI call made at an ingress PoP.

Today: the lowest backbone RTT among PoPs that are up and serve the model. The seam is here for
expected-TTFT routing (RTT + queue wait + prefill) and spill-over when a PoP is full.
"""

from __future__ import annotations

from edge_sim.errors import EdgeError
from edge_sim.network import NetworkModel
from edge_sim.pop import PopNode
from edge_sim.topology import PoP


class Router:
    def __init__(self, network: NetworkModel, nodes: dict[str, PopNode]):
        self.network = network
        self.nodes = nodes

    def candidates(self, model: str, ingress: PoP) -> list[tuple[PopNode, float]]:
        """PoPs that can take the call, best first, each with its backbone RTT from the ingress."""
        serving = [n for n in self.nodes.values() if n.serves(model)]
        if not serving:
            raise EdgeError("model_not_found", f"no PoP serves {model!r}")
        up = [n for n in serving if n.up]
        if not up:
            raise EdgeError("no_capacity", f"every PoP that serves {model!r} is down")
        ranked = [(n, self.network.backbone_rtt_ms(ingress, n.pop)) for n in up]
        ranked.sort(key=lambda item: (item[1], item[0].code))
        return ranked

    def choose(self, model: str, ingress: PoP) -> tuple[PopNode, float]:
        return self.candidates(model, ingress)[0]
