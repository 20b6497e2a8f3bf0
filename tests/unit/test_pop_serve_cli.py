"""`edge pop serve` without --name fails cleanly, naming --name and the topology's GPU PoPs."""

import subprocess
import sys

from edge_sim.topology import Topology
from tests.integration.dev_server import REPO


def test_pop_serve_without_name_says_so_and_exits_2(tmp_path):
    config = 'name = "n"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n'
    (tmp_path / "wrangler-like.toml").write_text(config)
    (tmp_path / "worker.py").write_text("")
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "pop", "serve", "--port", "0", "--token", "t"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)},
    )
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "edge pop serve needs --name CODE" in done.stderr
    codes = [p.code for p in Topology.default().gpu_pops()]
    assert "ICN" in codes and f"(one of {', '.join(codes)})" in done.stderr
