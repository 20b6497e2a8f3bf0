"""Durable Object alarms through a real `edge dev`: setAlarm / getAlarm / deleteAlarm, the alarm
handler run when due with alarm_info, a failing handler retried (retryCount, isRetry), an object
that re-arms its alarm for "now" in a loop not starving another's, and an alarm set before a
restart of edge dev firing after it."""

from __future__ import annotations

import json
import textwrap
import time

import httpx
import pytest

from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow

WORKER = """
import time

from workers import DurableObject, Response, WorkerEntrypoint


class Clock(DurableObject):
    async def arm(self, ms_from_now, fail_times=0):
        await self.ctx.storage.put("fail", fail_times)
        await self.ctx.storage.setAlarm(int(time.time() * 1000) + ms_from_now)
        return await self.ctx.storage.getAlarm()

    async def disarm(self):
        await self.ctx.storage.deleteAlarm()
        return await self.ctx.storage.getAlarm()

    async def alarm(self, alarm_info):
        fired = (await self.ctx.storage.get("fired")) or []
        fired.append([alarm_info.retryCount, alarm_info.isRetry, await self.ctx.storage.getAlarm()])
        await self.ctx.storage.put("fired", fired)
        fail = (await self.ctx.storage.get("fail")) or 0
        if fail > 0:
            await self.ctx.storage.put("fail", fail - 1)
            raise RuntimeError("not yet")

    async def report(self):
        return {"fired": (await self.ctx.storage.get("fired")) or [], "alarm": await self.ctx.storage.getAlarm()}


class Spinner(DurableObject):
    async def spin(self):
        await self.ctx.storage.setAlarm(0)

    async def alarm(self):
        n = (await self.ctx.storage.get("n")) or 0
        await self.ctx.storage.put("n", n + 1)
        if n < 100:
            await self.ctx.storage.setAlarm(int(time.time() * 1000))  # again at once, as a hostile loop

    async def count(self):
        return (await self.ctx.storage.get("n")) or 0


class Default(WorkerEntrypoint):
    async def fetch(self, request):
        parts = request.url.split("?")[0].split("/")
        action, name = parts[3], parts[4]
        if action == "spin":
            spinner = self.env.SPINNER.getByName(name)
            if len(parts) > 5:
                return Response(str(await spinner.count()))
            await spinner.spin()
            return Response("spinning")
        clock = self.env.CLOCK.getByName(name)
        if action == "arm":
            return Response.json(await clock.arm(int(parts[5]), int(parts[6])))
        if action == "disarm":
            return Response.json(await clock.disarm())
        return Response.json(await clock.report())
"""

CONFIG = {
    "name": "alarm-app",
    "main": "worker.py",
    "compatibility_date": "2025-01-01",
    "durable_objects": {
        "bindings": [
            {"name": "CLOCK", "class_name": "Clock"},
            {"name": "SPINNER", "class_name": "Spinner"},
        ]
    },
    "migrations": [{"tag": "v1", "new_sqlite_classes": ["Clock", "Spinner"]}],
}


def _report(dev: DevServer, name: str) -> dict:
    r = httpx.get(f"{dev.url}/report/{name}", timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _until(check, timeout: float = 30.0):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


def test_alarms_fire_retry_stay_fair_and_survive_a_restart(tmp_path):
    (tmp_path / "worker.py").write_text(textwrap.dedent(WORKER))
    config = tmp_path / "wrangler.jsonc"
    config.write_text(json.dumps(CONFIG, indent=2))

    with DevServer(config, cwd=tmp_path) as dev:
        assert httpx.get(f"{dev.url}/spin/s", timeout=60).text == "spinning"  # re-arms for ever
        before = int(time.time() * 1000)
        armed = httpx.get(f"{dev.url}/arm/a/300/1", timeout=60).json()  # fails once, then succeeds
        assert isinstance(armed, int) and armed >= before + 300
        assert httpx.get(f"{dev.url}/arm/gone/60000/0", timeout=60).json() >= before + 60000
        assert httpx.get(f"{dev.url}/disarm/gone", timeout=60).json() is None

        # the first try fails, the retry (2 s later) succeeds; during each run getAlarm() is None
        fired = _until(lambda: len(_report(dev, "a")["fired"]) >= 2 and _report(dev, "a"))
        assert fired == {"fired": [[0, False, None], [1, True, None]], "alarm": None}, fired
        assert int(httpx.get(f"{dev.url}/spin/s/count", timeout=60).text) >= 2  # it was spinning
        assert _report(dev, "gone") == {"fired": [], "alarm": None}

        armed = httpx.get(f"{dev.url}/arm/later/1500/0", timeout=60).json()
        assert _report(dev, "later") == {"fired": [], "alarm": armed}
    assert "failed (try 1): RuntimeError: not yet" in dev.log.read_text()

    with DevServer(config, cwd=tmp_path) as dev:  # set before the restart, due after it: it fires
        fired = _until(lambda: _report(dev, "later")["fired"])
        assert fired == [[0, False, None]]
        assert _report(dev, "later")["alarm"] is None
        assert _report(dev, "gone")["fired"] == []
