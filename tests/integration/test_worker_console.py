"""A worker's console in a real `edge dev`'s terminal, as `wrangler dev` shows one: print(),
print(file=sys.stderr), logging, sys.stdout.write and raw writes to fd 1, each line shown as it
happens under the worker's prefix (with the Durable Object or cron run it came from), escape
sequences escaped, a flood cut and counted."""

from __future__ import annotations

import json
import secrets
import textwrap
import time

import httpx
import pytest

from runtime.isolate.console import EVENT_LINES
from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

WORKER = """
import logging, os, sys
from workers import DurableObject, Response, WorkerEntrypoint


class Counter(DurableObject):
    async def hello(self, marker):
        print(f"object says hello {marker}")
        return "ok"


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        path, _, marker = request.url.split("/", 3)[3].partition("?m=")
        if path == "print":
            print(f"printed {marker}")
        elif path == "streams":
            print(f"to stderr {marker}", file=sys.stderr)
            sys.stdout.write(f"raw stdout {marker}\\n")
            logging.getLogger("app").warning(f"logged {marker}")
            os.write(1, f"fd one {marker}\\n".encode())
        elif path == "hostile":
            print(f"\\x1b[2J\\x1b[31mred {marker}\\r[other-worker] forged {marker}")
        elif path == "flood":
            for i in range(1000):
                print(f"flood {marker} {i}")
        elif path == "object":
            await self.env.COUNTER.getByName("a").hello(marker)
        return Response("ok")

    async def scheduled(self, controller, env, ctx):
        print(f"cron ran {controller.cron}")
"""

CONFIG = {
    "name": "console-app",
    "main": "worker.py",
    "compatibility_date": "2025-01-01",
    "durable_objects": {"bindings": [{"name": "COUNTER", "class_name": "Counter"}]},
    "migrations": [{"tag": "v1", "new_sqlite_classes": ["Counter"]}],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    folder = tmp_path_factory.mktemp("console")
    (folder / "worker.py").write_text(textwrap.dedent(WORKER))
    config = folder / "wrangler.jsonc"
    config.write_text(json.dumps(CONFIG, indent=2))
    with DevServer(config, cwd=folder, args=("--log-level", "info")) as srv:
        yield srv


def lines_with(server, text: str, at_least: int = 1, timeout: float = 5.0) -> list[str]:
    """The lines of edge dev's output holding `text`, once there are `at_least` of them (polled:
    they are written as they happen, so this returns at once; the timeout is generous)."""
    deadline = time.monotonic() + timeout
    while True:
        found = [line for line in server.log.read_text(errors="replace").splitlines() if text in line]
        if len(found) >= at_least or time.monotonic() > deadline:
            return found
        time.sleep(0.02)


def get(server, path: str) -> str:
    marker = secrets.token_hex(4)
    r = httpx.get(f"{server.url}/{path}", params={"m": marker}, timeout=60)
    assert r.status_code == 200, r.text
    return marker


def test_a_print_shows_in_the_terminal_as_it_happens_under_the_workers_name(server):
    marker = get(server, "print")
    answered = time.monotonic()
    found = lines_with(server, f"printed {marker}")
    assert found == [f"[console-app] printed {marker}"], server.log.read_text()[-3000:]
    assert time.monotonic() - answered < 5.0


def test_stderr_logging_raw_writes_and_fd_writes_show_too(server):
    marker = get(server, "streams")
    assert lines_with(server, f"to stderr {marker}") == [f"[console-app] error: to stderr {marker}"]
    assert lines_with(server, f"raw stdout {marker}") == [f"[console-app] raw stdout {marker}"]
    assert lines_with(server, f"logged {marker}") == [f"[console-app] warn: logged {marker}"]
    # os.write(1, ...) bypasses Python's streams: read from the pipe, shown under the same prefix
    assert lines_with(server, f"fd one {marker}") == [f"[console-app] fd one {marker}"]


def test_escape_sequences_are_escaped_and_no_line_takes_another_prefix(server):
    marker = get(server, "hostile")
    assert lines_with(server, f"red {marker}") == [f"[console-app] \\x1b[2J\\x1b[31mred {marker}"]
    assert lines_with(server, f"forged {marker}") == [f"[console-app] [other-worker] forged {marker}"]
    assert "\x1b" not in server.log.read_text(errors="replace")


def test_a_flood_is_cut_and_counted(server):
    marker = get(server, "flood")
    summary = lines_with(server, "more line(s) not shown")
    shown = lines_with(server, f"flood {marker} ", at_least=EVENT_LINES)
    assert len(shown) == EVENT_LINES and shown[0] == f"[console-app] flood {marker} 0"
    assert [s for s in summary if s.startswith("[console-app] … 800 more line(s) not shown")], summary


def test_a_durable_object_and_a_cron_run_carry_their_own_prefix(server):
    marker = get(server, "object")
    found = lines_with(server, f"object says hello {marker}")
    assert (
        len(found) == 1
        and found[0].startswith("[console-app:Counter(")
        and found[0].endswith(f")] object says hello {marker}")
    ), found
    r = httpx.get(f"{server.url}/cdn-cgi/handler/scheduled", params={"cron": "*/7 * * * *"}, timeout=60)
    assert r.status_code == 200, r.text
    assert lines_with(server, "cron ran */7") == ["[console-app:cron(*/7 * * * *)] cron ran */7 * * * *"]
