"""The roofline against published serving numbers: each point cites its source and computes ours
for the same configuration."""

from __future__ import annotations

import math

from capacity.crosscheck import DEEPSEEK_V3, cross_check, format_cross_check
from edge_sim.roofline import active_params, weight_bytes


def test_deepseek_v3_is_the_published_size():
    # 671B parameters, 37B active (DeepSeek-V3's model card), without the MTP layer
    assert 660e9 < weight_bytes(DEEPSEEK_V3).total_params < 690e9
    assert 36e9 < active_params(DEEPSEEK_V3) < 39e9


def test_every_point_cites_a_url_and_has_a_finite_gap():
    points = cross_check()
    assert len(points) >= 3
    for p in points:
        assert p.source.startswith("https://")
        assert p.theirs > 0 and p.ours > 0 and math.isfinite(p.gap)
        assert p.gap == p.ours / p.theirs
    table = format_cross_check(points)
    assert all(p.source in table for p in points)


def test_the_planner_sizes_kimi_k2_as_moonshot_does():
    k2 = cross_check()[0]
    assert "Kimi-K2" in k2.source and k2.metric == "GPUs"
    assert k2.ours == k2.theirs == 16
