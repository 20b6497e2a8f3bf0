"""Per-account metrics from one source: the engine's own per-tenant stats (EngineStats.accounts,
carried in a PoP's ModelStatus) become the runtime's Prometheus series, and they report the
preemptions and seats that this test caused."""

from __future__ import annotations

import random
from types import SimpleNamespace

from engine import LLM, SamplingParams
from runtime.ai.service import account_rows
from runtime.control.metrics import Metrics


def sample_value(text: str, name: str, **labels: str) -> float | None:
    for line in text.splitlines():
        if line.startswith(f"{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    return None


def test_the_metrics_report_the_preemptions_and_seats_a_test_caused(tiny_model_dir):
    rng = random.Random(4)
    llm = LLM(tiny_model_dir, device="cpu", allow_unsigned=True, max_num_seqs=4)
    engine = llm.engine
    params = SamplingParams(max_tokens=60, temperature=0, ignore_eos=True)
    for i in range(4):
        engine.add_request([rng.randrange(10, 4000) for _ in range(30)], params, f"h{i}", tenant="heavy")
    for _ in range(6):
        engine.step()
    for i in range(3):
        engine.add_request([rng.randrange(10, 4000) for _ in range(20)], params, f"l{i}", tenant="light")
    engine.step()  # the light account takes its share: two of the heavy one's four seats

    stats = engine.stats().accounts
    assert stats["heavy"].running == 2 and stats["light"].running == 2
    assert stats["heavy"].preemptions == 2 and stats["light"].preemptions == 0
    assert stats["heavy"].waiting == 2 and stats["light"].waiting == 1
    # its blocks: the running sequences' and, preempted by pause (the default), the paused ones'
    sched = engine.scheduler
    assert len(sched.paused) == 2
    holding = list(sched.running) + list(sched.paused.values())
    assert stats["heavy"].kv_blocks == sum(len(s.kv.block_table) for s in holding if s.tenant == "heavy")

    # the runtime reads every PoP's status (ModelStatus.accounts is EngineStats.accounts)
    status = SimpleNamespace(models={"@edge/test/tiny": SimpleNamespace(accounts=stats)})
    edge = SimpleNamespace(nodes={"ICN": SimpleNamespace(status=lambda: status)})
    metrics = Metrics()
    metrics.watch_accounts(lambda: account_rows(edge))
    metrics.ai_ttft("light", 0.04)
    metrics.ai_ttft("heavy", 3.0)
    text = metrics.render(detailed=True).decode()
    where = {"pop": "ICN", "model": "@edge/test/tiny"}
    assert sample_value(text, "edge_account_preemptions_total", account="heavy", **where) == 2
    assert sample_value(text, "edge_account_preemptions_total", account="light", **where) == 0
    assert sample_value(text, "edge_account_seats", account="heavy", **where) == 2
    assert sample_value(text, "edge_account_seats", account="light", **where) == 2
    assert sample_value(text, "edge_account_kv_blocks", account="heavy", **where) == stats["heavy"].kv_blocks
    assert sample_value(text, "edge_account_ttft_seconds_count", account="light") == 1
    assert sample_value(text, "edge_account_ttft_seconds_bucket", account="light", le="0.05") == 1
    assert sample_value(text, "edge_account_ttft_seconds_bucket", account="heavy", le="2.5") == 0
    # per-account series are the admin's: the open view has none
    assert "edge_account_" not in metrics.render().decode()
