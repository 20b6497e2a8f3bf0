"""Picks the GPU PoP for an AI call made at an ingress PoP.

The choice minimises the expected time to first token: the backbone RTT from the ingress, plus
the expected queue wait and this prompt's prefill at the PoP (edge_sim.load.route_score, which the
capacity simulator ranks its replicas by too). PoPs that are down, lack the model or are over their
admission limit are skipped, and the call spills to the next best; if none can take it, 3040.
A call that asked not to wait (`rejectIfBusy`) is offered only PoPs that would start it at once (no
request waiting, a seat free); with none, it is refused as busy rather than queued.
"""

from __future__ import annotations

from edge_sim.errors import EdgeError
from edge_sim.load import PopLoad, route_score
from edge_sim.network import NetworkModel
from edge_sim.node import PopNodeLike
from edge_sim.topology import PoP


class Router:
    def __init__(self, network: NetworkModel, nodes: dict[str, PopNodeLike]):
        self.network = network
        self.nodes = nodes

    def candidates(
        self,
        model: str,
        ingress: PoP,
        prompt_tokens: int = 0,
        exclude: frozenset[str] = frozenset(),
        at_once: bool = False,
    ) -> list[tuple[PopNodeLike, float]]:
        """PoPs that can take the call, best first, each with its backbone RTT from the ingress;
        `at_once`: only those that would start it now (EdgeError "busy" when none would)."""
        serving = [n for n in self.nodes.values() if n.serves(model)]
        if not serving:
            raise EdgeError("model_not_found", f"no PoP serves {model!r}")
        open_ = [n for n in serving if n.has_room() and n.code not in exclude]
        if not open_:
            states = ", ".join(f"{n.code} {'full' if n.up else 'down'}" for n in serving)
            raise EdgeError("no_capacity", f"no PoP can take {model!r} now ({states}); retry later")
        if at_once:
            open_ = [n for n in open_ if _starts_now(n.route_load(model))]
            if not open_:
                raise EdgeError(
                    "busy",
                    f"Capacity temporarily exceeded, please try again: every PoP serving {model!r} would "
                    "queue this call, and it asked not to wait (rejectIfBusy)",
                )
        ranked = []
        for node in open_:
            rtt = self.network.backbone_rtt_ms(ingress, node.pop)
            ranked.append((route_score(rtt, node.route_load(model), prompt_tokens), node.code, node, rtt))
        ranked.sort(key=lambda item: (item[0], item[1]))
        return [(node, rtt) for _, _, node, rtt in ranked]

    def choose(self, model: str, ingress: PoP, prompt_tokens: int = 0) -> tuple[PopNodeLike, float]:
        return self.candidates(model, ingress, prompt_tokens)[0]


def _starts_now(load: PopLoad) -> bool:
    """Whether a PoP would admit a new request at its next step: nobody waiting ahead of it and a
    sequence seat (and the KV blocks for one) free."""
    return load.waiting == 0 and load.seats >= 1
