"""Errors a worker can catch."""

from __future__ import annotations


class AIError(Exception):
    """A failed `env.AI.run`; the message starts with the Workers AI error code ("5007: ...")."""

    def __init__(self, code: int, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.detail = message
