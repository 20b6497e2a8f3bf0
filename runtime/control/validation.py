"""Turns msgspec validation errors into messages that name the field first."""

from __future__ import annotations

import re

import msgspec

_AT = re.compile(r" - at `\$\.?(.*)`$")


def describe(exc: msgspec.ValidationError) -> str:
    """'Expected `int`, got `str` - at `$.edge.pops[0]`' -> 'edge.pops.0: expected `int`, got `str`'."""
    message = str(exc)
    match = _AT.search(message)
    if not match:
        return message
    where = match.group(1).replace("[", ".").replace("]", "") or "(top level)"
    text = message[: match.start()]
    return f"{where}: {text[:1].lower()}{text[1:]}"
