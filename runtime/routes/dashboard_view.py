"""What the dashboard shows, read from what the runtime already measures: the topology, each GPU
PoP's status (its engines' EngineStats, per-account figures included: the source of the
per-account metrics too), the canaries in progress and the feed's windows (runtime.control.dashboard_feed)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from edge_sim.edge import Edge
from runtime.control.dashboard_feed import DashboardFeed
from runtime.control.rollout import Rollouts, canary_name

# `edge models rollout --max-p99-ttft-ratio`'s default: the latency rollback signal's threshold
P99_TTFT_RATIO_THRESHOLD = 1.5


def topology_view(edge: Edge) -> dict[str, Any]:
    """Every PoP at its place (sent once per browser: it does not change while the runtime runs)."""
    return {
        "pops": [
            {"code": p.code, "city": p.city, "lat": p.lat, "lon": p.lon, "gpu": p.code in edge.nodes}
            for p in edge.topology.pops.values()
        ]
    }


class SnapshotBuilder:
    """Builds the state of now; keeps the last generated-token counts to show decode tok/s."""

    def __init__(
        self,
        edge: Edge,
        feed: DashboardFeed,
        rollouts: Rollouts | None,
        ai_search: Callable[[], list[dict[str, Any]]] | None = None,
    ):
        self.edge, self.feed, self.rollouts = edge, feed, rollouts
        self.ai_search = ai_search  # each AI Search instance's indexing progress (runtime.ai.search)
        self._generated: dict[tuple[str, str], tuple[float, int]] = {}

    def build(self) -> dict[str, Any]:
        now = time.monotonic()
        pops, seats, blocks, per_account = [], 0, 0, {}
        models: dict[str, dict[str, Any]] = {}
        for code, node in list(self.edge.nodes.items()):
            try:
                status = node.status()
            except Exception:  # a node going away mid-read has nothing to show
                continue
            engines = {}
            for name, m in status.models.items():
                engines[name] = {
                    "running": m.running,
                    "waiting": m.waiting,
                    "kv_used": m.kv_blocks_used,
                    "kv_free": m.kv_blocks_free,
                    "kv_total": m.kv_blocks_total,
                    "weights": m.weights,
                    "kv_dtype": m.kv_cache_dtype,
                    "tok_s": self._decode_rate(code, name, m.generated_tokens, now),
                }
                seats += m.seat_limit
                blocks += m.kv_blocks_total
                for account, a in m.accounts.items():
                    row = per_account.setdefault(account, {"seats": 0, "kv_blocks": 0, "waiting": 0})
                    row["seats"] += a.running
                    row["kv_blocks"] += a.kv_blocks
                    row["waiting"] += a.waiting
                model = models.setdefault(name, {"pops": [], "weights": set(), "kv_dtype": set()})
                model["pops"].append(code)
                model["weights"].add(m.weights)
                model["kv_dtype"].add(m.kv_cache_dtype)
            pops.append(
                {
                    "code": code,
                    "up": status.up,
                    "in_flight": status.in_flight,
                    "queue_depth": status.queue_depth,
                    "max_in_flight": status.max_in_flight,
                    "models": engines,
                }
            )
        return {
            "t": time.time(),
            "pops": pops,
            "accounts": self._accounts(per_account, seats, blocks),
            "models": self._models(models),
            "series": self.feed.series.view(),
            "ai_search": self.ai_search() if self.ai_search is not None else [],
            "work_s": round(self.feed.work_s, 6),  # the dashboards' cost so far (dashboard_feed)
        }

    def _decode_rate(self, code: str, model: str, generated: int, now: float) -> float:
        last = self._generated.get((code, model))
        self._generated[(code, model)] = (now, generated)
        if last is None or now <= last[0]:
            return 0.0
        return round(max(0, generated - last[1]) / (now - last[0]), 1)

    def _accounts(self, engine_rows: dict[str, dict], seats: int, blocks: int) -> dict[str, dict]:
        out = self.feed.accounts_view()
        for name in engine_rows.keys() | out.keys():
            row = out.setdefault(name, {"requests": 0, "tokens_in": 0, "tokens_out": 0, "rate_limited": 0})
            held = engine_rows.get(name, {"seats": 0, "kv_blocks": 0, "waiting": 0})
            row.update(held)
            row["seat_share"] = round(held["seats"] / seats, 4) if seats else 0.0
            row["kv_share"] = round(held["kv_blocks"] / blocks, 4) if blocks else 0.0
        return out

    def _models(self, models: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        canaries = self.rollouts.canaries if self.rollouts is not None else {}
        out = {}
        for name, m in models.items():
            view: dict[str, Any] = {
                "pops": sorted(m["pops"]),
                "weights": sorted(m["weights"]),
                "kv_dtype": sorted(m["kv_dtype"]),
                "rollout": None,
            }
            if (canary := canaries.get(name)) is not None:
                base, cand = self.feed.model_p99_ttft(name), self.feed.model_p99_ttft(canary_name(name))
                view["rollout"] = {
                    "new": str(canary.new),
                    "share": canary.share,
                    "started": canary.started,
                    "p99_ttft_ms": {"baseline": base, "canary": cand},
                    "p99_ttft_ratio": round(cand / base, 3) if base and cand else None,
                    "p99_ttft_ratio_threshold": P99_TTFT_RATIO_THRESHOLD,
                    # the other signal is measured offline by `edge models rollout` before it finishes
                    "perplexity": "measured by edge models rollout at finish",
                }
            out[name] = view
        return out
