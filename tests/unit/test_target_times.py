"""Roofline-modeled times for a catalog entry's full-size target (timing.modeled)."""

import pytest

from edge_sim.roofline import SimulationError
from edge_sim.target import TargetSpec, modeled_times
from edge_sim.topology import Topology

TOPO = Topology.default()


def test_more_gpus_model_faster_and_tpot_is_the_mean_decode_step():
    spec = TargetSpec(model="kimi-k2", weights="fp8")
    icn = modeled_times(spec, TOPO.pop("ICN"), 512, 65, batch=8, network_ms=20.0)  # 8 x H200
    iad = modeled_times(spec, TOPO.pop("IAD"), 512, 65, batch=8, network_ms=20.0)  # 16 x H200
    assert icn.target.endswith("on 8 x H200") and iad.target.endswith("on 16 x H200")
    assert iad.prefill_ms < icn.prefill_ms and iad.decode_ms < icn.decode_ms
    assert icn.tpot_ms == pytest.approx(icn.decode_ms / 64, rel=1e-3)
    # decode at a bigger batch reads more KV and more distinct experts per step
    busier = modeled_times(spec, TOPO.pop("ICN"), 512, 65, batch=64, network_ms=20.0)
    assert busier.tpot_ms > icn.tpot_ms


def test_weights_that_do_not_fit_the_pops_gpus_are_reported_not_timed():
    bom = TOPO.pop("BOM")  # L4s: 24 GiB each
    m = modeled_times(TargetSpec(model="kimi-k2"), bom, 100, 10, batch=1, network_ms=0.0)
    assert not m.fits and m.prefill_ms is None and "L4" in m.target
    # naming the GPUs explicitly models them wherever the request ran
    m = modeled_times(TargetSpec(model="glm-4.5", gpu="H200", gpus=8), bom, 100, 10, 1, 0.0)
    assert m.fits and m.target == "glm-4.5 fp8 weights, auto KV on 8 x H200"


@pytest.mark.parametrize(
    "spec, field",
    [
        (TargetSpec(model="gpt-5"), "gpt-5"),
        (TargetSpec(model="kimi-k2", weights="fp4"), "fp4"),
        (TargetSpec(model="kimi-k2", kv="fp16"), "fp16"),
        (TargetSpec(model="kimi-k2", gpu="B200"), "B200"),
        (TargetSpec(model="kimi-k2", gpus=0), "gpus"),
    ],
)
def test_a_bad_target_names_what_to_change(spec, field):
    with pytest.raises(SimulationError, match=field):
        spec.check()
