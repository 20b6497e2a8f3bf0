"""Errors a worker can catch."""

from __future__ import annotations


class AIError(Exception):
    """A failed `env.AI.run`; the message starts with the Workers AI error code ("5007: ...").
    `param`: the input at fault, where one is (OpenAI's error.param)."""

    def __init__(self, code: int, message: str, param: str | None = None):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message
        self.param = param


class InferenceUpstreamError(AIError):
    """What Cloudflare's AI binding raises when the model's service answers an error (workerd's
    `InferenceUpstreamError`): `name` is that, the message "code: description", `.code` the
    Workers AI error code. An AIError, so `except AIError` catches it too."""

    name = "InferenceUpstreamError"


class AiGatewayInternalError(Exception):
    """What `env.AI.gateway(id)`'s getUrl / getLog / patchLog raise when the gateway fails
    (workerd's name); `name` is that."""

    name = "AiGatewayInternalError"


class AiGatewayLogNotFound(AiGatewayInternalError):
    """getLog / patchLog of a log id the gateway does not hold (workerd's `AiGatewayLogNotFound`)."""

    name = "AiGatewayLogNotFound"
