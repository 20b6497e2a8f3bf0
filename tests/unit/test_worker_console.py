"""A worker's console in edge dev's terminal (runtime.isolate.console): each line under the
worker's prefix, control characters escaped, bounded per event with a count of the rest; the
isolate's side (sys.stdout / sys.stderr into log lines), the stdout/stderr pipes, and the tail's
pretty print, all held to the same rules."""

from __future__ import annotations

import asyncio
import logging
import types

import msgspec
import pytest

from runtime.control.config_schema import ObservabilityConfig
from runtime.control.dashboard_feed import DashboardFeed
from runtime.host.worker_calls import WorkerCalls
from runtime.isolate import console as isolate_console
from runtime.isolate import ipc
from runtime.isolate.console import EVENT_LINES, LINE_CHARS, WorkerConsole, clean
from runtime.isolate.inside.channel import (
    LOG_LINE_CHARS,
    Channel,
    ConsoleStream,
    current_request,
    worker_print,
)
from runtime.isolate.output import OUTPUT_LINES, OutputPump


@pytest.fixture
def shown(caplog):
    """The console lines shown, as (level, text); every event sampled."""
    saved = (isolate_console.settings.enabled, isolate_console.settings.sampling)
    isolate_console.settings.enabled, isolate_console.settings.sampling = True, 1.0
    caplog.set_level(logging.DEBUG, logger="edge.console")

    def lines():
        return [(r.levelname, r.getMessage()) for r in caplog.records if r.name == "edge.console"]

    yield lines
    isolate_console.settings.enabled, isolate_console.settings.sampling = saved


def test_control_characters_are_escaped_and_each_line_carries_the_prefix(shown):
    console = WorkerConsole("app")
    event = console.event()
    event.write("log", "hello")
    event.write("log", "\x1b[2J\x1b]0;owned\x07cleared?\rback\n[victim] forged line")
    event.write("log", "bidi \u202eevil\u202c and a zero\u200bwidth, tabs\tstay, é ✓ stay")
    event.write("error", "on stderr")
    event.write("warning", "careful")
    event.write("\x1b[31mred", "an unknown level is shown as log")
    assert shown() == [
        ("INFO", "[app] hello"),
        ("INFO", "[app] \\x1b[2J\\x1b]0;owned\\x07cleared?"),
        ("INFO", "[app] back"),
        ("INFO", "[app] [victim] forged line"),  # under its own prefix: no line passes for another's
        ("INFO", "[app] bidi \\u202eevil\\u202c and a zero\\u200bwidth, tabs\tstay, é ✓ stay"),
        ("ERROR", "[app] error: on stderr"),
        ("WARNING", "[app] warn: careful"),
        ("INFO", "[app] an unknown level is shown as log"),
    ]
    assert clean("\x9b31m \x7f \U000e0041") == "\\x9b31m \\x7f \\U000e0041"  # C1 CSI, DEL, a tag character


def test_prefixes_name_the_object_and_the_event(shown):
    WorkerConsole("app@1a2b3c4d:Counter(9f8e7d6c)").event().write("log", "in the object")
    WorkerConsole("app").event("cron(*/5 * * * *)").write("log", "in the cron run")
    WorkerConsole("app").event("queue(jobs)").write("log", "in the batch")
    WorkerConsole("evil\x1b[0m]").write("log", "outside")  # a label is cleaned too
    assert [text for _, text in shown()] == [
        "[app@1a2b3c4d:Counter(9f8e7d6c)] in the object",
        "[app:cron(*/5 * * * *)] in the cron run",
        "[app:queue(jobs)] in the batch",
        "[evil\\x1b[0m]] outside",
    ]


def test_an_event_shows_a_bounded_number_of_lines_and_counts_the_rest(shown):
    event = WorkerConsole("app").event()
    event.write("log", "x" * (LINE_CHARS + 500))
    for i in range(EVENT_LINES + 300):
        event.write("log", f"line {i}")
    event.end()
    lines = shown()
    assert lines[0][1] == f"[app] {'x' * LINE_CHARS} … [500 more characters]"
    assert len(lines) == EVENT_LINES + 1 and lines[-2][1] == f"[app] line {EVENT_LINES - 2}"
    assert lines[-1][0] == "WARNING" and lines[-1][1].startswith("[app] … 301 more line(s) not shown")
    event.end()  # said once
    assert len(shown()) == EVENT_LINES + 1


def test_one_message_of_many_lines_outside_an_event_is_bounded_too(shown):
    WorkerConsole("app").write("log", "\n".join(f"l{i}" for i in range(5000)))
    lines = shown()
    assert len(lines) == isolate_console.MESSAGE_LINES + 1 and "4950 more line(s)" in lines[-1][1]


def test_the_log_level_and_observability_decide_what_shows(shown, caplog):
    caplog.set_level(logging.WARNING, logger="edge.console")
    event = WorkerConsole("app").event()
    event.write("log", "hidden at warning")
    event.write("error", "shown")
    assert shown() == [("ERROR", "[app] error: shown")]

    caplog.set_level(logging.INFO, logger="edge.console")
    obs = msgspec.convert({"enabled": False}, ObservabilityConfig)
    isolate_console.configure(obs)
    assert not isolate_console.settings.enabled and "not shown" in isolate_console.settings.describe()
    WorkerConsole("app").event().write("log", "silenced")
    WorkerConsole("app").write("log", "silenced too")
    isolate_console.configure(msgspec.convert({"logs": {"head_sampling_rate": 0}}, ObservabilityConfig))
    assert isolate_console.settings.enabled and isolate_console.settings.sampling == 0.0
    WorkerConsole("app").event().write("log", "not sampled")
    isolate_console.configure(msgspec.convert({"head_sampling_rate": 0.25}, ObservabilityConfig))
    assert isolate_console.settings.sampling == 0.25 and "25%" in isolate_console.settings.describe()
    isolate_console.configure(None)
    assert isolate_console.settings.enabled and isolate_console.settings.describe() is None
    assert shown() == [("ERROR", "[app] error: shown")]
    with pytest.raises(msgspec.ValidationError, match="<= 1.0"):
        msgspec.convert({"head_sampling_rate": 2}, ObservabilityConfig)


def test_edge_dev_shows_lines_bare_stdout_below_warning_and_stderr_above(capsys):
    terminal = isolate_console.terminal
    handlers, propagate, level = list(terminal.handlers), terminal.propagate, terminal.level
    isolate_console.install()
    isolate_console.install()  # once only
    terminal.setLevel(logging.INFO)
    try:
        event = WorkerConsole("app").event()
        event.write("log", "to stdout")
        event.write("error", "to stderr")
    finally:
        terminal.handlers[:], terminal.propagate = handlers, propagate
        terminal.setLevel(level)
    out, err = capsys.readouterr()
    assert out == "[app] to stdout\n" and err == "[app] error: to stderr\n"


# --- inside the isolate: sys.stdout and sys.stderr become log lines ------------------------------------


class _Writer:
    def __init__(self):
        self.frames: list[bytes] = []

    def write(self, frame: bytes) -> None:
        self.frames.append(frame)

    def is_closing(self) -> bool:
        return False


def _sent(writer: _Writer) -> list[tuple[int, str, str]]:
    out = []
    for frame in writer.frames:
        msg = ipc.decode(frame[4:])
        out.append((msg.request, msg.level, msg.message) if isinstance(msg, ipc.Log) else type(msg).__name__)
    return out


def test_writes_to_stdout_and_stderr_cross_as_lines_of_their_request():
    async def go():
        writer = _Writer()
        channel = Channel(None, writer)
        out, err = ConsoleStream(channel, "log", None), ConsoleStream(channel, "error", None)
        current_request.set(7)
        worker_print("hello", "there", file=out)
        worker_print("a\nb", file=out)  # one print, one line of the tail (the terminal shows two)
        out.write("no newline yet")
        err.write("to stderr\n")
        out.write(" ... now\nand a rest")
        out.buffer.write(b"\xffbytes\n")
        out.write("x" * (LOG_LINE_CHARS + 10))  # too long to wait for: sent now, cut
        out.write("y" * 100 + "\nafter the long one\n")  # the rest of the long line is dropped
        out.write("held until the answer")
        channel.send(ipc.InvokeResult(7, 200, [], b""))
        return writer, out

    writer, out = asyncio.run(go())
    assert _sent(writer) == [
        (7, "log", "hello there"),
        (7, "log", "a\nb"),
        (7, "error", "to stderr"),
        (7, "log", "no newline yet ... now"),
        (7, "log", "and a rest\ufffdbytes"),
        (7, "log", "x" * LOG_LINE_CHARS),
        (7, "log", "after the long one"),
        (7, "log", "held until the answer"),
        "InvokeResult",
    ]
    assert not out.isatty() and out.writable()
    with pytest.raises(TypeError):
        out.write(b"bytes")
    with pytest.raises(TypeError):
        worker_print("x", sep=1, file=out)


def test_outside_the_event_loop_writes_go_to_the_real_pipe():
    written = []
    real = types.SimpleNamespace(write=written.append, flush=lambda: None, fileno=lambda: 1)
    stream = ConsoleStream(Channel(None, _Writer()), "log", real)
    stream.write("after the loop\n")
    assert written == ["after the loop\n"] and stream.fileno() == 1


def test_the_isolate_stops_sending_past_its_budget_after_saying_so():
    from runtime.isolate.inside import channel as isolate_channel

    async def go():
        writer = _Writer()
        channel = Channel(None, writer)
        current_request.set(3)
        for i in range(isolate_channel.LOG_LINES + 50):
            channel.log("log", f"{i}")
        return _sent(writer)

    sent = asyncio.run(go())
    assert len(sent) == isolate_channel.LOG_LINES + 1
    assert sent[-1][1] == "warn" and "sends no more for this request" in sent[-1][2]


# --- the runtime's side: terminal and tail from one line ----------------------------------------------


def _calls(requests):
    published = []
    tail = types.SimpleNamespace(publish=lambda account, worker, event: published.append(event))
    spec = types.SimpleNamespace(account="local", name="app", version=None)
    services = types.SimpleNamespace(tail=tail)
    return WorkerCalls(spec, requests, services, WorkerConsole("app")), published


def test_a_request_line_reaches_the_terminal_at_once_and_its_tail_event(shown):
    from runtime.host.invocation import Invocation

    ctx = Invocation(None, None, 0.0)
    calls, published = _calls({5: ctx})
    calls.log(ipc.Log(5, "log", "in the request"))
    assert shown() == [("INFO", "[app] in the request")]  # before the request has ended
    assert [entry["message"] for entry in ctx.logs] == ["in the request"]
    for i in range(EVENT_LINES + 10):
        calls.log(ipc.Log(5, "log", f"flood {i}"))
    ctx.console.end()
    assert "11 more line(s) not shown" in shown()[-1][1]

    calls.log(ipc.Log(99, "error", "outside any request"))
    assert shown()[-1] == ("ERROR", "[app] error: outside any request")
    assert published[-1]["logs"][0]["message"] == "outside any request"


def test_lines_outside_any_request_are_rate_limited_and_the_dropped_counted(shown):
    calls, published = _calls({})
    for i in range(calls._background_logs.burst + 30):
        calls.output("log", f"background {i}")
    assert len(published) == calls._background_logs.burst
    calls._background_logs.tokens = 1.0  # time passes
    calls.output("log", "later")
    assert published[-1]["logs"][0]["message"].startswith("… 30 line(s) outside any request dropped")
    assert published[-1]["logs"][1]["message"] == "later"
    assert shown()[-2][1].startswith("[app] warn: … 30 line(s)") and shown()[-1][1] == "[app] later"


def test_the_pipes_are_bounded_per_request_and_the_dropped_counted():
    seen = []
    pump = OutputPump("app", lambda level, text: seen.append((level, text)))

    async def go():
        reader = asyncio.StreamReader()
        reader.feed_data(b"".join(b"raw %d\n" % i for i in range(OUTPUT_LINES + 40)))
        reader.feed_data(b"z" * 10_000)  # a line with no end, cut
        reader.feed_eof()
        await pump.pump(reader, "error")

    asyncio.run(go())
    assert seen[0] == ("error", "raw 0") and len(seen) == OUTPUT_LINES + 2
    assert seen[OUTPUT_LINES][0] == "warn" and "over 200 lines" in seen[OUTPUT_LINES][1]
    assert seen[-1] == ("warn", "… 41 line(s) of output on stdout/stderr dropped")
    pump.reset()
    assert pump.lines_left == OUTPUT_LINES


def test_edge_tail_pretty_print_escapes_the_workers_text():
    from runtime.cli import _pretty

    event = {
        "eventTimestamp": 0,
        "outcome": "ok",
        "event": {"request": {"method": "GET", "url": "http://x/"}, "response": {"status": 200}},
        "logs": [{"level": "log", "message": "hi\x1b[2J\n[other] forged"}],
        "exceptions": [{"name": "ValueError", "message": "bad\rthing", "stack": ""}],
    }
    lines = _pretty(event).splitlines()
    assert lines[1:] == ["  (log) hi\\x1b[2J", "    [other] forged", "  ValueError: bad", "    thing"]


OBJECT_SCRIPT = """
from workers import DurableObject, Response, WorkerEntrypoint


class Counter(DurableObject):
    async def hello(self):
        print("hello from the object")
        return 1


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        return Response("ok")
"""


def test_a_durable_object_call_shows_under_its_prefix_and_in_the_tail(tmp_path, shown):
    from runtime.bindings import BindingStores
    from runtime.control.tail import TailHub
    from runtime.host.invocation import Invocation
    from runtime.host.objects import DurableObjects, namespace_key
    from runtime.host.sockets import SocketHub
    from runtime.host.spec import DurableObjectRef, WorkerSpec
    from runtime.host.worker import WorkerHandle
    from runtime.isolate.process import IsolateLimits
    from workers.durable_objects import id_from_name

    (tmp_path / "worker.py").write_text(OBJECT_SCRIPT)
    tail = TailHub()
    secrets = types.SimpleNamespace(secrets=lambda account, name: {})
    fake = types.SimpleNamespace(
        secrets=secrets, bindings=BindingStores(tmp_path / ".edge"), tail=tail, feed=DashboardFeed()
    )
    fake.sockets, fake.on_alarm = SocketHub(), None
    fake.objects = DurableObjects(lambda spec: WorkerHandle(spec, fake))
    spec = WorkerSpec(
        account="acct",
        name="w",
        version=None,
        script=str(tmp_path / "worker.py"),
        vars={},
        ai_binding=None,
        services={},
        limits=IsolateLimits(),
        durable_objects={"COUNTER": DurableObjectRef("Counter")},
    )
    oid = id_from_name(namespace_key("acct", "w", "Counter"), "a")

    async def go():
        events = tail.subscribe("acct", "w")
        try:
            call = ipc.ObjectCall(1, 1, "COUNTER", oid, "hello", [], {})
            reply = await fake.objects.call(spec, call, Invocation(None, None, 0.0))
        finally:
            await fake.objects.stop()
        return reply, events.get_nowait()

    try:
        reply, event = asyncio.run(go())
    finally:
        fake.bindings.close()
    assert reply.result == 1
    assert shown() == [("INFO", f"[w:Counter({oid[:8]})] hello from the object")]
    assert event["event"] == {"rpcMethod": "hello"} and event["outcome"] == "ok"
    assert [entry["message"] for entry in event["logs"]] == ["hello from the object"]
