"""bench/soak.py's sampler on a short run: a process and its child sampled twice, summarised."""

import os
import subprocess
import sys

from bench.soak import sample, slope_per_hour, summary


def test_two_samples_of_a_process_and_its_child_are_summarised():
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        first = sample(os.getpid(), 0.0)
        second = sample(os.getpid(), 10.0)
    finally:
        child.kill()
        child.wait()
    for s in (first, second):
        me = s["roles"]["runtime"]
        assert me["rss"] > 0 and me["files"] > 0 and me["threads"] >= 1 and me["processes"] == 1
        assert sum(v["processes"] for v in s["roles"].values()) >= 2  # the child too
    text = summary([first, second], failed=0, completed=3)
    assert "runtime  RSS MiB" in text and "requests: 3 completed, 0 failed" in text


def test_slope_per_hour():
    assert slope_per_hour([(0.0, 10.0), (1800.0, 15.0), (3600.0, 20.0)]) == 10.0
    assert slope_per_hour([(0.0, 1.0)]) == 0.0
