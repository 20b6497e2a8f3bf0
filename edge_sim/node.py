"""The interface the router and the runtime drive a GPU PoP through, in-process (pop.PopNode) or in
another process (remote.RemotePopNode), and the pieces both kinds share (NodeBase). Whatever may
cross a network is async on both, so callers never ask which kind they hold; what the router ranks
by is sync (a remote node answers from its last health check)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from edge_sim.errors import EdgeError
from edge_sim.load import PopLoad
from edge_sim.request import Formats, GenerateRequest, GenerateResult
from engine import SeqEvent
from engine.errors import GenerationError

if TYPE_CHECKING:
    from edge_sim.status import PopStatus
    from edge_sim.topology import PoP


@runtime_checkable
class PopNodeLike(Protocol):
    pop: PoP
    refused: dict[str, str]  # model -> why its last load was refused

    @property
    def code(self) -> str: ...

    @property
    def up(self) -> bool: ...

    @property
    def in_flight(self) -> int:
        """Requests submitted and not finished (the batch a new request decodes beside)."""
        ...

    def models(self) -> list[str]: ...

    def serves(self, model: str) -> bool: ...

    def has_room(self) -> bool: ...

    def route_load(self, model: str) -> PopLoad:
        """What the router ranks the node by for `model` (edge_sim.load.route_score)."""
        ...

    def formats(self, model: str) -> Formats:
        """The formats `model` is served in here (Formats.unknown() if it is not)."""
        ...

    def status(self) -> PopStatus: ...

    async def refresh(self) -> bool:
        """Update what the router ranks by; whether the node answered."""
        ...

    async def take_down(self) -> int:
        """Stop taking requests; how many queued ones were handed back to be re-routed."""
        ...

    async def bring_up(self) -> None: ...

    def stream(self, req: GenerateRequest) -> AsyncIterator[SeqEvent]:
        """An async generator of token events; the last carries the metrics. The node tokenizes
        the request (the only place on the path that does)."""
        ...

    async def generate(self, req: GenerateRequest) -> GenerateResult: ...

    def close(self) -> None: ...


class NodeBase:
    """What PopNode and RemotePopNode do alike, written once: their name, what they serve and a
    whole answer collected from their own stream."""

    pop: PoP

    @property
    def code(self) -> str:
        return self.pop.code

    def models(self) -> list[str]:
        raise NotImplementedError

    def formats(self, model: str) -> Formats:
        raise NotImplementedError

    def stream(self, req: GenerateRequest) -> AsyncIterator[SeqEvent]:
        raise NotImplementedError

    def serves(self, model: str) -> bool:
        return model in self.models()

    async def generate(self, req: GenerateRequest) -> GenerateResult:
        formats = self.formats(req.model)
        choices = req.assembler(formats)
        try:
            async for event in self.stream(req):
                choices.push(event)
        except GenerationError as exc:  # an event this request did not ask for
            raise EdgeError("invalid_input", str(exc)) from None
        return GenerateResult.assembled(choices, self.code, req.model, formats)
