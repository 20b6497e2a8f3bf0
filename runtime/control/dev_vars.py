"""Local secrets for `edge dev`, as wrangler reads them: `.dev.vars` beside the config, else `.env`.

The dotenv shape: `KEY=value` lines, `#` comments, an optional `export ` prefix, values bare (an
inline ` #` starts a comment), in single quotes (taken as written) or in double quotes (`\\n`,
`\\t`, `\\"` and `\\\\` expanded; a value may run over several lines). They reach `env` as
strings, over `vars` and `edge secret put`'s secrets, for the dev worker only: never bundled by
`edge deploy` (the jail and the bundle leave hidden files out) and never logged. A line that is
not `KEY=value` is reported by its number, never by its content, since it may hold a secret.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path

log = logging.getLogger("edge.config")

FILES = (".dev.vars", ".env")  # the first found wins, as wrangler's
MAX_BYTES = 1024 * 1024
_LINE = re.compile(r"\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)\s*=\s*(.*)")
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


def _double_quoted(rest: str, lines: list[str], at: int) -> tuple[str, int] | None:
    """The value of a double-quoted entry starting after its quote, and the next line's index."""
    out: list[str] = []
    text, i = rest, at
    while True:
        j = 0
        while j < len(text):
            ch = text[j]
            if ch == "\\" and j + 1 < len(text):
                out.append(_ESCAPES.get(text[j + 1], "\\" + text[j + 1]))
                j += 2
                continue
            if ch == '"':
                return "".join(out), i + 1
            out.append(ch)
            j += 1
        i += 1
        if i >= len(lines):
            return None  # no closing quote
        out.append("\n")
        text = lines[i]


def parse_dev_vars(text: str, source: str = ".dev.vars") -> dict[str, str]:
    """The entries of a dotenv text; the lines it cannot read are warned about by number."""
    lines = text.splitlines()
    found: dict[str, str] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.lstrip().startswith("#"):
            i += 1
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            log.warning("%s:%d: not KEY=value; the line is skipped", source, i + 1)
            i += 1
            continue
        key, rest = match.group(1), match.group(2)
        if rest.startswith('"'):
            read = _double_quoted(rest[1:], lines, i)
            if read is None:
                log.warning("%s:%d: %s's double quote is never closed; skipped", source, i + 1, key)
                break
            found[key], i = read
            continue
        if rest.startswith("'") and "'" in rest[1:]:
            found[key] = rest[1 : rest.index("'", 1)]
        else:
            found[key] = re.split(r"\s+#", rest, maxsplit=1)[0].strip()
        i += 1
    return found


def read_dev_vars(folder: Path) -> tuple[Path | None, dict[str, str]]:
    """The local secrets file in `folder` (FILES' order) and its entries; (None, {}) when none."""
    for name in FILES:
        path = folder / name
        if not path.is_file():
            continue
        size = path.stat().st_size
        if size > MAX_BYTES:
            log.warning("%s: %d bytes, over %d; not read", path, size, MAX_BYTES)
            return path, {}
        return path, parse_dev_vars(path.read_text(encoding="utf-8", errors="replace"), str(path))
    return None, {}
