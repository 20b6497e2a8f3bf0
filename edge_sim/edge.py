"""The edge as the runtime sees it: locate a client, pick its ingress, run an AI call, account for it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from edge_sim.accounting import LatencyAccount
from edge_sim.affinity import SessionAffinity
from edge_sim.errors import EdgeError, PopDown
from edge_sim.network import NetworkModel
from edge_sim.node import PopNodeLike
from edge_sim.pop import ModelSpec, PopNode
from edge_sim.remote import RemotePopNode
from edge_sim.request import GenerateRequest, GenerateResult
from edge_sim.router import Router
from edge_sim.target import TargetSpec, modeled_times
from edge_sim.topology import Location, PoP, Topology
from edge_sim.upstream import UpstreamPopNode
from engine import SeqEvent
from engine.errors import GenerationError
from engine.structured.choices import Delta

log = logging.getLogger("edge.edge")


class Edge:
    def __init__(
        self, topology: Topology, network: NetworkModel, nodes: dict[str, PopNodeLike], emulate: bool = False
    ):
        self.topology = topology
        self.network = network
        self.nodes = nodes
        self.router = Router(network, nodes)
        # "emulate": simulated network delays are really waited; "account": only reported
        self.emulate = emulate
        # catalog name -> the full-size model it stands for; its modeled times join the account
        self.targets: dict[str, TargetSpec] = {}
        self.affinity = SessionAffinity()

    @classmethod
    def start(
        cls,
        topology: Topology,
        network: NetworkModel,
        gpu_pops: list[str],
        models: list[ModelSpec],
        device: str | None = None,
    ) -> Edge:
        """Load an in-process node, with an engine per model, at each of `gpu_pops`."""
        nodes: dict[str, PopNodeLike] = {}
        for code in gpu_pops:
            pop = topology.pop(code)
            # a PoP with a URL in the topology is a node process elsewhere (`edge pop serve`); one
            # with an upstream forwards to an OpenAI-compatible server (vLLM, SGLang, ...)
            if pop.upstream is not None:
                nodes[pop.code] = UpstreamPopNode(pop)
            elif pop.url:
                nodes[pop.code] = RemotePopNode(pop, pop.url)
            else:
                nodes[pop.code] = PopNode.load(pop, models, device=device)
        return cls(topology, network, nodes)

    def remote_nodes(self) -> list[RemotePopNode | UpstreamPopNode]:
        """The nodes in other processes: health-checked, and never reachable from a worker's fetch."""
        return [n for n in self.nodes.values() if isinstance(n, RemotePopNode | UpstreamPopNode)]

    def locate(self, text: str) -> Location:
        return self.topology.resolve_location(text)

    def ingress(self, client: Location) -> tuple[PoP, float]:
        """Anycast: the client lands on its nearest PoP; returns it and the client RTT."""
        pop, _ = self.network.nearest_pop(client, self.topology.pops.values())
        return pop, self.network.client_rtt_ms(client, pop)

    def models(self) -> list[str]:
        return sorted({m for node in self.nodes.values() for m in node.models()})

    def refusal(self, model: str) -> str | None:
        """Why no PoP serves `model`, when every PoP refused to load it."""
        reasons = [node.refused[model] for node in self.nodes.values() if model in node.refused]
        return reasons[0] if reasons and model not in self.models() else None

    def reload(self, spec: ModelSpec, device: str | None = None) -> dict[str, str | None]:
        """Load a new version of a model at every in-process PoP; per PoP, None or why it was refused
        (a remote node reloads on its own host)."""
        return {
            code: node.reload(spec, device) for code, node in self.nodes.items() if isinstance(node, PopNode)
        }

    def unload(self, name: str) -> None:
        """Stop serving a model at every in-process PoP (a remote node is left as it is)."""
        for node in self.nodes.values():
            if isinstance(node, PopNode):
                node.unload(name)

    async def stream(
        self, req: GenerateRequest, ingress: PoP, client_rtt_ms: float
    ) -> AsyncIterator[Delta | GenerateResult]:
        """Deltas as the chosen PoP produces them (per choice: text, logprobs when asked for, tool
        calls parsed from the model's format when tools were declared), then the whole result, its
        n choices in index order, with its timing.

        Routing ranks PoPs by the prompt's estimated length (only the PoP that serves the request
        tokenizes it). A PoP that goes down before it starts the request hands it back and the
        next best takes it.
        """
        tokens = req.estimated_tokens()
        tried: set[str] = set()
        sticky = self.affinity.preferred(req.tenant, req.model, req.session)
        while True:
            ranked = self.router.candidates(
                req.model, ingress, tokens, frozenset(tried), at_once=req.reject_if_busy
            )
            # a session goes back to the PoP holding its cache while that PoP is up and has room
            node, backbone_ms = next(((n, rtt) for n, rtt in ranked if n.code == sticky), ranked[0])
            if self.emulate:  # the request travels ingress -> PoP for real
                await asyncio.sleep(backbone_ms / 2000)
            formats = node.formats(req.model)
            choices = req.assembler(formats)
            last = None
            batch = 1
            try:
                async for event in node.stream(req):
                    if last is None:  # the request is in flight: how many decode beside it
                        batch = max(1, node.in_flight)
                    try:
                        delta = choices.push(event)
                    except GenerationError as exc:  # an event this request did not ask for
                        raise EdgeError("invalid_input", str(exc)) from None
                    if delta is not None:
                        yield delta
                    last = event
                break
            except PopDown:
                if last is not None:
                    raise EdgeError("no_capacity", f"PoP {node.code} went down mid-answer") from None
                tried.add(node.code)  # it went down before starting this request: next best
                log.warning("%s went down before serving a request; re-routing", node.code)
        self.affinity.served(req.tenant, req.model, req.session, node.code)
        if self.emulate:
            await asyncio.sleep(backbone_ms / 2000)
        if not choices.done:
            raise EdgeError("no_capacity", f"PoP {node.code} ended the answer before every choice ended")
        result = GenerateResult.assembled(choices, node.code, req.model, node.formats(req.model))
        result.timing = self._account(
            req.model, node.pop, ingress, client_rtt_ms, backbone_ms, choices.last, batch
        )
        result.timing.draft_tokens, result.timing.accepted_tokens = choices.speculated()
        yield result

    def _account(
        self,
        model: str,
        pop: PoP,
        ingress: PoP,
        client_rtt_ms: float,
        backbone_ms: float,
        last: SeqEvent,
        batch: int,
    ) -> LatencyAccount:
        """The latency account of an answer: network parts, the PoP's measured times and, for a
        catalog target, the modeled times of the full-size model on this PoP's GPUs."""
        m = last.metrics
        account = LatencyAccount(
            client_rtt_ms=client_rtt_ms,
            backbone_rtt_ms=backbone_ms,
            ingress=ingress.code,
            pop=pop.code,
            queue_ms=m.queue_ms,
            prefill_ms=m.prefill_ms,
            decode_ms=m.decode_ms,
            tpot_ms=m.tpot_ms,
            cached_tokens=m.cached_tokens,
        )
        target = self.targets.get(model)
        if target is not None:
            account.modeled = modeled_times(
                target, pop, m.prompt_tokens, m.completion_tokens, batch, client_rtt_ms + backbone_ms
            )
        return account

    async def run(self, req: GenerateRequest, ingress: PoP, client_rtt_ms: float) -> GenerateResult:
        """The whole answer, its `timing` set."""
        async for item in self.stream(req, ingress, client_rtt_ms):
            if isinstance(item, GenerateResult):
                return item
        raise AssertionError("the stream ended without a result")

    def close(self) -> None:
        for node in self.nodes.values():
            node.close()
