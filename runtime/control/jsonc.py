"""wrangler.json and wrangler.jsonc text: JSON with comments and trailing commas, as wrangler reads
both; every error names the line and column."""

from __future__ import annotations

import json
from typing import Any

from runtime.control.config_schema import ConfigError


def _position(text: str, index: int) -> tuple[int, int]:
    """1-based line and column of `index` in `text`."""
    line = text.count("\n", 0, index) + 1
    return line, index - (text.rfind("\n", 0, index) + 1) + 1


def strip_jsonc(text: str, source: str = "wrangler.jsonc") -> str:
    """JSONC -> JSON: comments (`//`, `/* */`) and trailing commas become spaces, so that every
    other character keeps its line and column; strings (with their escapes) are left untouched."""
    out = list(text)
    i, n = 0, len(text)
    pending_comma = None  # index of a comma outside strings, until the next significant character
    while i < n:
        c = text[i]
        if c == '"':
            pending_comma = None
            i += 1
            while i < n and text[i] != '"' and text[i] != "\n":
                i += 2 if text[i] == "\\" else 1
            i += 1  # past the closing quote (an unterminated string is left to the JSON parser)
            continue
        if c == "/" and text.startswith("//", i):
            end = text.find("\n", i)
            end = n if end == -1 else end
            out[i:end] = " " * (end - i)
            i = end
            continue
        if c == "/" and text.startswith("/*", i):
            end = text.find("*/", i + 2)
            if end == -1:
                line, col = _position(text, i)
                raise ConfigError(
                    f"{source}: invalid JSON: unterminated /* comment at line {line}, column {col}"
                )
            for j in range(i, end + 2):
                if out[j] != "\n":
                    out[j] = " "
            i = end + 2
            continue
        if c in " \t\r\n":
            i += 1
            continue
        if c in "]}" and pending_comma is not None:
            out[pending_comma] = " "  # a trailing comma
        pending_comma = i if c == "," else None
        i += 1
    return "".join(out)


def parse_jsonc(text: str, source: str = "wrangler.jsonc") -> dict[str, Any]:
    """wrangler.json / wrangler.jsonc text (comments and trailing commas allowed in both, as in
    wrangler) -> a dict; errors give the line and column."""
    try:
        data = json.loads(strip_jsonc(text.removeprefix("\ufeff"), source))
    except json.JSONDecodeError as exc:
        raise ConfigError(
            f"{source}: invalid JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ) from None
    except RecursionError:
        raise ConfigError(f"{source}: invalid JSON: arrays or objects nested too deep") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object at the top level, got {type(data).__name__}")
    return data
