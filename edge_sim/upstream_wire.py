"""The OpenAI wire for an upstream PoP (edge_sim.upstream): our typed request as a /v1/chat/completions
or /v1/completions body, the upstream's server-sent events read back into per-choice pieces, and its
HTTP errors as the edge's error kinds (which the runtime maps to Workers AI codes).

Tool calls come back parsed by the upstream, and are not trusted: each is held until it ends and
kept only if its arguments parse as a JSON object (ChunkReader); it is then written again in Kimi
K2's tool-call markup (CARRIER_FORMAT), which the edge's own parser reads and checks against the
declared tools (engine.structured.tool_parser), so the edge streams an upstream's calls exactly as it
streams our engine's. Call ids are the edge's, not the upstream's.
"""

from __future__ import annotations

import json
import logging
from typing import Any, NamedTuple

from edge_sim.errors import EdgeError
from edge_sim.request import GenerateRequest
from edge_sim.upstream_config import UpstreamModel
from engine.outputs import Logprobs, TokenLogprob
from engine.structured import tool_calls as fmts
from engine.structured.reasoning_parser import MARKERS

log = logging.getLogger(__name__)
CARRIER_FORMAT = fmts.KIMI_K2  # the markup upstream tool calls are re-written in for the edge's parser
THINK_OPEN, THINK_CLOSE = MARKERS[CARRIER_FORMAT]  # ... and its reasoning
MAX_LINE_BYTES = 4 * 1024 * 1024  # one server-sent event; an upstream sending more is cut off
MAX_ERROR_BYTES = 64 * 1024
MAX_ERROR_MESSAGE = 1000


def request_body(req: GenerateRequest, model: UpstreamModel, cache_salt: str | None) -> tuple[str, dict]:
    """The path (under base_url) and JSON body that ask the upstream for `req`, streamed."""
    p = req.params
    body: dict[str, Any] = {
        "model": model.upstream_model,
        "max_tokens": p.max_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "n": p.n,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    # extensions vLLM and SGLang take; sent only when set, so a strict OpenAI server is not refused
    for key, value, default in (
        ("top_k", p.top_k, 0),
        ("min_p", p.min_p, 0.0),
        ("repetition_penalty", p.repetition_penalty, 1.0),
        ("frequency_penalty", p.frequency_penalty, 0.0),
        ("presence_penalty", p.presence_penalty, 0.0),
        ("seed", p.seed, None),
        ("ignore_eos", p.ignore_eos, False),
    ):
        if value != default:
            body[key] = value
    if p.stop:
        body["stop"] = list(p.stop)
    if p.stop_token_ids:
        body["stop_token_ids"] = list(p.stop_token_ids)
    if p.logit_bias:  # (token ids of the upstream's model, as the client named them)
        body["logit_bias"] = {str(token): bias for token, bias in p.logit_bias.items()}
    if cache_salt is not None:
        body["cache_salt"] = cache_salt
    if req.messages is None:
        body["prompt"] = req.prompt or ""
        if p.logprobs is not None:
            body["logprobs"] = p.logprobs
        if p.guide is not None:
            body["response_format"] = _response_format(req)
        return "/v1/completions", body
    body["messages"] = req.messages
    if req.thinking is not None:  # under both families' template names (engine.tokenizer)
        body["chat_template_kwargs"] = {"enable_thinking": req.thinking, "thinking": req.thinking}
    if p.logprobs is not None:
        body["logprobs"], body["top_logprobs"] = True, p.logprobs
    if p.guide is not None:
        body["response_format"] = _response_format(req)
    if req.tools:
        body["tools"] = [_tool(t) for t in req.tools]
        body["tool_choice"] = (
            req.tool_choice
            if req.tool_choice in ("auto", "none", "required")
            else {"type": "function", "function": {"name": req.tool_choice}}
        )
        if not req.parallel_tool_calls:
            body["parallel_tool_calls"] = False
    return "/v1/chat/completions", body


def _tool(tool: Any) -> dict[str, Any]:
    fn = {"name": tool.name, "description": tool.description, "parameters": tool.parameters}
    if tool.strict:
        fn["strict"] = True
    return {"type": "function", "function": fn}


def _response_format(req: GenerateRequest) -> dict[str, Any]:
    guide = req.params.guide
    if guide.kind == "json":
        return {"type": "json_object"}
    if guide.kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "response", "schema": guide.schema}}
    raise EdgeError(
        "invalid_input",
        f"guide: a {guide.kind} guide is not sent to an OpenAI upstream (it takes response_format "
        "json_object or json_schema); ask for JSON, or call a model served by this edge's own engine",
    )


# --- the stream back -------------------------------------------------------------------------------


class Piece(NamedTuple):
    """What one upstream chunk added to choice `index`: text, its tokens' logprobs, and the end."""

    index: int
    text: str
    logprobs: list[Logprobs]
    finish_reason: str | None


def sse_data(line: str) -> str | None:
    """The payload of a `data:` line (None for comments, blank lines and other fields)."""
    if not line.startswith("data:"):
        return None
    return line[5:].strip()


class ChunkReader:
    """Reads the upstream's chunks (chat or completions) into Pieces, and keeps its usage.

    Its tool calls are parsed, never trusted: each is held until it ends (the next call, content
    after it, or the choice's end), then written in the carrier markup only if its name is a
    function name and its arguments parse as a JSON object; any other is dropped and counted in
    `rejected` (the edge's parser then checks it against the declared tools, the tool choice and a
    strict tool's schema)."""

    def __init__(self, n: int):
        self.n = n
        self.usage: dict[str, Any] | None = None
        self.rejected = 0  # upstream calls dropped: no function name, or arguments not a JSON object
        self._calls: list[dict[Any, list[str]]] = [{} for _ in range(n)]  # per choice: index -> [name, args]
        self._open: list[Any] = [None] * n  # the call whose arguments are being written
        self._written = [0] * n  # calls written in the carrier markup (its section is open)
        # per choice: its reasoning (an upstream's reasoning_content / reasoning deltas) written in the
        # carrier's think block: "" none yet, "open", "closed" (content came: later reasoning dropped)
        self._thought = [""] * n

    def read(self, payload: str) -> list[Piece]:
        try:
            chunk = json.loads(payload)
        except ValueError:
            raise EdgeError("no_capacity", f"upstream event not JSON: {payload[:200]!r}") from None
        if not isinstance(chunk, dict):
            raise EdgeError("no_capacity", "the upstream sent an event that is not a JSON object")
        if "error" in chunk:  # an error reported inside the stream (after its HTTP 200)
            raise error_from_body(chunk, _status_in_stream(chunk["error"]))
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        pieces = []
        for choice in chunk.get("choices") or []:
            index = choice.get("index", 0) if isinstance(choice, dict) else -1
            if not isinstance(index, int) or not 0 <= index < self.n:
                raise EdgeError("no_capacity", f"the upstream sent choice {index!r} (of {self.n})")
            pieces.append(self._piece(index, choice))
        return pieces

    def _piece(self, index: int, choice: dict[str, Any]) -> Piece:
        delta = choice.get("delta")
        thought = ""
        if isinstance(delta, dict):  # chat
            text = delta.get("content") or ""
            if text:  # content after calls: end them first
                text = self._close(index) + text
            text = "".join(self._tool_markup(index, c) for c in delta.get("tool_calls") or []) + text
            thought = self._reasoning(index, delta)
        else:  # completions
            text = choice.get("text") or ""
        if text and self._thought[index] == "open":
            thought += THINK_CLOSE
            self._thought[index] = "closed"
        text = thought + text
        finish = choice.get("finish_reason")
        if finish is not None:
            if self._thought[index] == "open":
                text += THINK_CLOSE
            text += self._close(index)
            finish = "stop" if finish == "tool_calls" else str(finish)
        return Piece(index, text, logprobs_of(choice.get("logprobs")), finish)

    def _reasoning(self, index: int, delta: dict[str, Any]) -> str:
        """An upstream's reasoning piece (vLLM's `reasoning_content`, or `reasoning` since it renamed
        it) in the carrier's think block, which the edge's reasoning parser reads back."""
        piece = delta.get("reasoning_content") or delta.get("reasoning")
        if not isinstance(piece, str) or not piece or self._thought[index] == "closed":
            return ""
        if self._thought[index] == "open":
            return piece
        self._thought[index] = "open"
        return THINK_OPEN + piece

    def _tool_markup(self, index: int, call: Any) -> str:
        """A streamed tool call's piece: held; what it ends (the call before it) in the markup."""
        if not isinstance(call, dict):
            return ""
        fn = call.get("function") if isinstance(call.get("function"), dict) else {}
        number = call.get("index", len(self._calls[index]))
        if not isinstance(number, (int, str)):
            return ""
        out = ""
        calls = self._calls[index]
        if number not in calls and isinstance(fn.get("name"), str) and fn["name"]:
            out += self._end_call(index)
            calls[number] = [fn["name"], ""]
            self._open[index] = number
        arguments = fn.get("arguments")
        if isinstance(arguments, str) and self._open[index] == number:
            held = calls[number]
            if len(held[1]) + len(arguments) > MAX_LINE_BYTES:
                held[0] = ""  # (dropped at its end)
            else:
                held[1] += arguments
        return out

    def _end_call(self, index: int) -> str:
        """The open call in the carrier markup, if it holds up ("" when none is open or it does not)."""
        number, self._open[index] = self._open[index], None
        if number is None:
            return ""
        name, arguments = self._calls[index][number]
        try:
            ok = bool(fmts.TOOL_NAME.fullmatch(name)) and isinstance(json.loads(arguments or "{}"), dict)
        except ValueError:
            ok = False
        if not ok:
            self.rejected += 1
            log.warning("upstream tool call %r dropped: its arguments are not a JSON object", name[:64])
            return ""
        opening = "" if self._written[index] else fmts.KIMI_SECTION_BEGIN
        k = self._written[index]
        self._written[index] += 1
        return (
            f"{opening}{fmts.KIMI_CALL_BEGIN}functions.{name}:{k}{fmts.KIMI_ARGS_BEGIN}"
            f"{arguments or '{}'}{fmts.KIMI_CALL_END}"
        )

    def _close(self, index: int) -> str:
        out = self._end_call(index)
        if not self._written[index]:
            return out
        self._written[index] = 0
        return out + fmts.KIMI_SECTION_END


def _token(entry: dict[str, Any]) -> TokenLogprob:
    token = str(entry.get("token", ""))
    raw = entry.get("bytes")
    data = raw if isinstance(raw, list) else list(token.encode())
    return TokenLogprob(token, float(entry.get("logprob", 0.0)), data)


def logprobs_of(raw: Any) -> list[Logprobs]:
    """Logprobs in either API's shape (chat: content[]; completions: tokens/token_logprobs)."""
    if not isinstance(raw, dict):
        return []
    if isinstance(raw.get("content"), list):
        return [
            Logprobs(_token(e), [_token(t) for t in e.get("top_logprobs") or [] if isinstance(t, dict)])
            for e in raw["content"]
            if isinstance(e, dict)
        ]
    tokens, chosen = raw.get("tokens") or [], raw.get("token_logprobs") or []
    tops = raw.get("top_logprobs") or [None] * len(tokens)
    out = []
    for token, logprob, top in zip(tokens, chosen, tops, strict=False):
        alternatives = [
            TokenLogprob(t, float(lp), list(t.encode())) for t, lp in (top or {}).items() if lp is not None
        ]
        out.append(Logprobs(TokenLogprob(token, float(logprob or 0.0), list(token.encode())), alternatives))
    return out


# --- errors ----------------------------------------------------------------------------------------------


def error_message(body: Any) -> str:
    """The message in an OpenAI, Workers AI or FastAPI error body (or the body's start)."""
    if isinstance(body, dict):
        err = body.get("error")
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])[:MAX_ERROR_MESSAGE]
        if isinstance(err, str):
            return err[:MAX_ERROR_MESSAGE]
        errors = body.get("errors")
        if isinstance(errors, list) and errors and isinstance(errors[0], dict):
            return str(errors[0].get("message", ""))[:MAX_ERROR_MESSAGE]
        if body.get("detail") or body.get("message"):
            return str(body.get("detail") or body.get("message"))[:MAX_ERROR_MESSAGE]
    return str(body)[:MAX_ERROR_MESSAGE]


# Workers AI's codes (another edge dev as the upstream) as the HTTP status each stands for
_WORKERS_AI_STATUS = {5004: 400, 5007: 404, 3006: 413, 3040: 503, 3007: 504}


def _status_in_stream(error: Any) -> int:
    """The HTTP status an in-stream error stands for: vLLM and SGLang put one in `code`, an edge dev
    a Workers AI code; a bad-request type without either is a 400; anything else a 503."""
    if not isinstance(error, dict):
        return 503
    code = error.get("code")
    if isinstance(code, int) and code in _WORKERS_AI_STATUS:
        return _WORKERS_AI_STATUS[code]
    if isinstance(code, int) and 400 <= code < 600:
        return code
    kind = str(error.get("type", "")).lower()
    return 400 if "invalid_request" in kind or "badrequest" in kind else 503


def error_from_body(body: Any, status: int) -> EdgeError:
    """The edge's error for an upstream answer with HTTP `status`: 400/422 -> invalid input (its
    message kept), 404 -> no such model, 413 -> too large, 429/503 (and other 5xx) -> out of
    capacity, 408/504 -> timeout."""
    message = f"upstream: {error_message(body)}"
    if status in (400, 422):
        return EdgeError("invalid_input", message)
    if status == 404:
        return EdgeError("model_not_found", message)
    if status == 413:
        return EdgeError("too_large", message)
    if status in (408, 504):
        return EdgeError("timeout", message)
    return EdgeError("no_capacity", message)


def parse_error(content: bytes, status: int) -> EdgeError:
    try:
        body: Any = json.loads(content[:MAX_ERROR_BYTES])
    except ValueError:
        body = content[:MAX_ERROR_MESSAGE].decode(errors="replace")
    return error_from_body(body, status)
