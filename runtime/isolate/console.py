"""A worker's console in `edge dev`'s terminal, as `wrangler dev` shows one: the lines its print(),
logging and writes to sys.stdout / sys.stderr send, shown as they arrive (no batching), each under
the prefix of what wrote it: `[worker]`, `[worker:Counter(1a2b3c4d)]` for a Durable Object,
`[worker:cron(*/5 * * * *)]`, `[worker:queue(jobs)]`. Lines below WARNING go to edge dev's
stdout, the rest to its stderr; a level other than log/info is named after the prefix
(`[worker] error: ...`).

Everything shown here is the worker's own text, so none of it is trusted: a message of several
lines shows each line under the prefix (no line can pass for another worker's or the runtime's),
control characters (escape sequences, carriage returns, bidi overrides) are shown escaped
(`\\x1b`), a line is cut at LINE_CHARS, and one event (a request, a cron run, a queue batch, an RPC
call) shows at most EVENT_LINES lines and EVENT_CHARS characters, the rest counted and summarized
in one line when the event ends. `--log-level` is the lowest level shown (print is info,
print(file=sys.stderr) error); the config's [observability] (`configure`) turns the lines off
(`enabled = false`) or shows a sample of events (`head_sampling_rate`).
"""

from __future__ import annotations

import logging
import random
import re
import sys
from typing import Any

LINE_CHARS = 1024  # of one line shown; the rest is counted on it
EVENT_LINES = 200  # lines one event shows
EVENT_CHARS = 64 * 1024  # characters one event shows
MESSAGE_LINES = 50  # lines one message outside any event shows

terminal = logging.getLogger("edge.console")

LEVELS = {
    "debug": logging.DEBUG,
    "log": logging.INFO,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "critical": logging.CRITICAL,
}
_SHOWN_AS = {logging.DEBUG: "debug: ", logging.WARNING: "warn: ", logging.ERROR: "error: "}
_SHOWN_AS[logging.CRITICAL] = "critical: "

# C0 and C1 controls (but tab), DEL, and the invisible or reordering format characters: soft
# hyphen, bidi marks, embeddings, overrides and isolates, zero-width characters, word joiners,
# the BOM, interlinear annotations, tag characters; lone surrogates
_UNSAFE = re.compile(
    "[\x00-\x08\x0a-\x1f\x7f-\x9f\u00ad\u061c\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f"
    "\ufeff\ufff9-\ufffb\ud800-\udfff\U000e0000-\U000e007f]"
)


def _escaped(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def clean(text: str) -> str:
    """`text` safe to write to a terminal: control and invisible format characters escaped."""
    return _UNSAFE.sub(_escaped, text)


def cut(line: str) -> str:
    """One line as shown: cut at LINE_CHARS (saying how much was cut), then cleaned."""
    if len(line) <= LINE_CHARS:
        return clean(line)
    return f"{clean(line[:LINE_CHARS])} … [{len(line) - LINE_CHARS} more characters]"


def indented(text: str, indent: str = "    ") -> str:
    """A block of the worker's text (an exception and its traceback) for the runtime's own log:
    cleaned, and every line after the first indented, so that none can pass for a console line."""
    first, *rest = text.splitlines() or [""]
    return "\n".join([cut(first), *(indent + cut(line) for line in rest)])


class ConsoleSettings:
    """What [observability] asks of the terminal: whether console lines show at all, and the
    fraction of events whose lines show."""

    def __init__(self, enabled: bool = True, sampling: float = 1.0):
        self.enabled, self.sampling = enabled, sampling

    def sampled(self) -> bool:
        return self.enabled and (self.sampling >= 1.0 or random.random() < self.sampling)

    def describe(self) -> str | None:
        """A line for edge dev's banner when the console is not shown whole; None when it is."""
        if not self.enabled:
            return (
                "workers' console lines are not shown ([observability] enabled = false); edge tail has them"
            )
        if self.sampling < 1.0:
            return (
                f"workers' console lines are shown for {self.sampling:.0%} of events "
                "([observability] head_sampling_rate)"
            )
        return None


settings = ConsoleSettings()


def configure(observability: Any) -> None:
    """Read the config's [observability] (runtime.control.config_schema.ObservabilityConfig, or None):
    `enabled = false` (or `logs.enabled = false`) shows no console lines in the terminal (edge
    tail still has them); `head_sampling_rate` (or `logs.head_sampling_rate`), from 0 to 1, is the
    fraction of events whose lines show. Unset: every line shows."""
    logs = getattr(observability, "logs", None)
    enabled = (
        getattr(observability, "enabled", None) is not False and getattr(logs, "enabled", None) is not False
    )
    rate = getattr(logs, "head_sampling_rate", None)
    if rate is None:
        rate = getattr(observability, "head_sampling_rate", None)
    settings.enabled = enabled
    settings.sampling = 1.0 if rate is None else min(1.0, max(0.0, float(rate)))


class _TerminalHandler(logging.Handler):
    """Console lines as they are: below WARNING on stdout, the rest on stderr, flushed at once."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            stream = sys.stdout if record.levelno < logging.WARNING else sys.stderr
            stream.write(self.format(record) + "\n")
            stream.flush()
        except Exception:
            self.handleError(record)


def install() -> None:
    """`edge dev`: console lines go to the terminal bare (`[worker] text`), not in the runtime's
    log format; their lowest level is the root logger's (`--log-level`)."""
    if not any(isinstance(h, _TerminalHandler) for h in terminal.handlers):
        terminal.addHandler(_TerminalHandler())
    terminal.propagate = False


def _show(levelno: int, prefix: str, line: str, named: bool = True) -> None:
    terminal.log(levelno, "%s %s%s", prefix, _SHOWN_AS.get(levelno, "") if named else "", line)


class EventLines:
    """One event's console lines: its prefix, whether it was sampled, what it may still show."""

    __slots__ = ("prefix", "shown", "lines", "chars", "lines_left", "chars_left", "dropped")

    def __init__(self, prefix: str, shown: bool, lines: int = EVENT_LINES, chars: int = EVENT_CHARS):
        self.prefix, self.shown, self.lines, self.chars = prefix, shown, lines, chars
        self.lines_left, self.chars_left, self.dropped = lines, chars, 0

    def write(self, level: str, text: str) -> None:
        """A message the worker logged: each of its lines under the prefix, while the budget lasts."""
        levelno = LEVELS.get(level, logging.INFO)
        if not self.shown or not terminal.isEnabledFor(levelno):
            return
        for line in text.splitlines() or [""]:
            size = min(len(line), LINE_CHARS)
            if self.lines_left <= 0 or size > self.chars_left:
                self.lines_left = 0
                self.dropped += 1
                continue
            self.lines_left -= 1
            self.chars_left -= size
            _show(levelno, self.prefix, cut(line))

    def end(self, what: str = "an event") -> None:
        """The event is over: one line for what it was not allowed to show."""
        if self.dropped and terminal.isEnabledFor(logging.WARNING):
            _show(
                logging.WARNING,
                self.prefix,
                f"… {self.dropped} more line(s) not shown: {what} shows at most {self.lines} lines and "
                f"{self.chars // 1024} KiB here",
                named=False,
            )
        self.dropped = 0


class WorkerConsole:
    """The console of one worker's isolate (`label`: its name, version, Durable Object)."""

    def __init__(self, label: str):
        self.label = clean(label)[:200]
        self.prefix = f"[{self.label}]"

    def event(self, tag: str = "") -> EventLines:
        """The lines of one event (`tag`: what it is, as `cron(*/5 * * * *)`), sampled now."""
        prefix = f"[{self.label}:{clean(tag)[:200]}]" if tag else self.prefix
        return EventLines(prefix, settings.sampled())

    def write(self, level: str, text: str) -> None:
        """A message outside any event (module-level output, waitUntil after the response, raw
        output on the isolate's pipes): at most MESSAGE_LINES of its lines."""
        lines = EventLines(self.prefix, settings.enabled, MESSAGE_LINES, EVENT_CHARS)
        lines.write(level, text)
        lines.end("a message outside any request")
