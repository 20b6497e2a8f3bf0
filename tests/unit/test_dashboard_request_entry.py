"""A finished request as the dashboard lists it (runtime.host.request_entry) stays small whatever the
worker did: its log lines, its AI calls and its path are cut to fixed bounds, and the query string
(which may carry a client's secrets) is left out."""

import json

from edge_sim.accounting import LatencyAccount
from edge_sim.topology import Location, Topology
from runtime.control.ai_record import AIRecord
from runtime.control.limits import IsolateLimits
from runtime.host.invocation import Invocation
from runtime.host.request_entry import AI_CALLS, LOG_CHARS, LOG_LINES, PATH_CHARS, request_entry
from runtime.host.spec import WorkerSpec


def test_an_entry_is_bounded_whatever_the_worker_logged_called_or_was_asked():
    spec = WorkerSpec("acct", "loud", None, "worker.py", {}, "AI", {}, IsolateLimits())
    icn = Topology.default().pops["ICN"]
    url = "http://127.0.0.1:8787/" + "a" * 5_000 + "?api_key=hunter2"
    ctx = Invocation(Location("Seoul", 37.57, 126.98), icn, 2.0, method="POST", url=url)
    ctx.logs = [{"level": "log", "message": f"{i} " + "x" * 10_000} for i in range(500)]
    call = LatencyAccount(
        client_rtt_ms=2, backbone_rtt_ms=0, ingress="ICN", pop="ICN", queue_ms=1, prefill_ms=3, decode_ms=5
    )
    for i in range(100):  # each through an AI Gateway the worker named at will, each answered
        record = AIRecord("@edge/m", "acct", f"req-{i}", served="@edge/m", timing=call)
        record.quantization = "weights=bf16"
        record.through_gateway("g" * 1000, "log" * 100, "HIT")
        ctx.ai_calls.append(record)
        ctx.ai_answers.append(record)
    entry = request_entry(spec, ctx, "ok", {"request": {}, "response": {"status": 201}}, 0.25)
    assert entry["status"] == 201 and entry["account"] == "acct" and entry["worker"] == "loud"
    assert len(entry["path"]) == PATH_CHARS and entry["path"].startswith("/aaa")
    assert "hunter2" not in json.dumps(entry)
    assert len(entry["logs"]) == LOG_LINES and entry["logs"][-1]["message"].startswith("499 ")
    assert all(len(line["message"]) == LOG_CHARS for line in entry["logs"])
    assert len(entry["ai"]) == AI_CALLS and entry["ai_calls"] == 100
    first = entry["ai"][0]
    assert (first["pop"], first["model"], first["prefill_ms"], first["total_ms"]) == ("ICN", "@edge/m", 3, 11)
    assert len(entry["gateway"]) == AI_CALLS
    assert entry["gateway"][0] == {"gateway": "g" * 64, "log": ("log" * 100)[:64], "cache": "HIT"}
    assert len(json.dumps(entry)) < 20_000
