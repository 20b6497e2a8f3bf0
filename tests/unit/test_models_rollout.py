"""edge models rollout against a real edge dev: a copy of the miniature signed with a test key is
promoted; a copy with perturbed weights, signed with the same key, is rolled back. Each decision is in the
tail, in /metrics and in the model's history."""

import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine.load.integrity import MANIFEST, keygen, sign
from runtime.bench.devserver import start_dev, write_project
from runtime.control.rollout import Rollouts, in_canary

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "models" / "kimi-k2-mini"
TINY = 'name = "tiny"\n[prompt]\ndist = "fixed"\nmean = 24\n[output]\ndist = "fixed"\nmean = 4\n'


def test_the_split_is_sticky_per_session_key_and_near_the_share():
    keys = [f"s{i}" for i in range(2000)]
    assert [in_canary(k, 10) for k in keys] == [in_canary(k, 10) for k in keys]
    assert 120 < sum(in_canary(k, 10) for k in keys) < 280
    assert not in_canary(None, 50) and not in_canary("x", 0)
    r = Rollouts()
    assert r.route("m", "s1") == "m"


@pytest.mark.slow
def test_rollout_promotes_a_good_version_and_rolls_back_a_worse_one(tmp_path):
    key = tmp_path / "test.key"
    pub = keygen(key)
    good, bad = tmp_path / "good", tmp_path / "bad"
    shutil.copytree(BASELINE, good)
    (good / MANIFEST).unlink()
    sign(good, key)
    shutil.copytree(BASELINE, bad)
    (bad / MANIFEST).unlink()
    _perturb(bad / "model.safetensors")
    sign(bad, key)
    project = tmp_path / "project"
    project.mkdir()
    (project / "tiny.toml").write_text(TINY)
    release = REPO / "models" / "keys" / "release.pub"
    write_project(project, "ro", extra_toml=f'[models]\ntrusted_keys = ["{release}", "{pub}"]\n')
    proc, url = start_dev(project, {"OMP_NUM_THREADS": "1"})
    events: list[dict] = []
    try:
        token = (project / ".edge" / "api-token").read_text().strip()
        admin = (project / ".edge" / "admin-token").read_text().strip()
        listener = threading.Thread(target=_listen, args=(url, token, events), daemon=True)
        listener.start()

        def rollout(new, *extra):
            return subprocess.run(
                [sys.executable, "-m", "runtime.cli", "models", "rollout", str(new),
                 "--baseline", str(BASELINE),
                 "--canary", "50", "--at-contexts", "64,8192", "--max-windows", "1", "--request-rates", "inf",
                 "--num-prompts", "6", "--max-concurrency", "3", "--dataset", "tiny.toml", "--url", url,
                 "--pubkey", str(release), "--pubkey", str(pub), *extra],
                cwd=project, env={k: v for k, v in os.environ.items() if k != "EDGE_API_TOKEN"},
                capture_output=True, text=True, timeout=600, check=False,
            )  # fmt: skip

        ok = rollout(good, "--max-p99-ttft-ratio", "1000")
        assert ok.returncode == 0, ok.stdout + ok.stderr
        assert "PROMOTED" in ok.stdout and "8192: past the model's 4096-token window" in ok.stderr
        worse = rollout(bad, "--max-p99-ttft-ratio", "1000")
        assert worse.returncode == 1, worse.stdout + worse.stderr
        assert "ROLLED BACK" in worse.stderr and "perplexity" in worse.stderr
        metrics = httpx.get(url + "/cdn-cgi/edge/metrics", timeout=30).text
        model = "@edge/moonshotai/kimi-k2-mini"
        assert f'edge_model_rollouts_total{{decision="promoted",model="{model}"}} 1.0' in metrics
        assert f'edge_model_rollouts_total{{decision="rolled_back",model="{model}"}} 1.0' in metrics
        left = httpx.get(url + "/cdn-cgi/edge/models/rollout", headers={"authorization": f"Bearer {admin}"})
        assert left.json() == {"rollouts": []}
        for _ in range(100):
            if len([e for e in events if "rollout" in e]) >= 2:
                break
            time.sleep(0.1)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=30)
    decisions = [e["rollout"]["decision"] for e in events if "rollout" in e]
    assert decisions == ["promoted", "rolled_back"]
    good_history = [json.loads(x) for x in (tmp_path / "promotions.jsonl").read_text().splitlines()]
    assert [(h["new"], h["decision"]) for h in good_history] == [
        (str(good), "promoted"),
        (str(bad), "rolled_back"),
    ]
    assert any("perplexity" in r for r in good_history[1]["reasons"])
    assert good_history[0]["latency"][0]["canary_p99_ttft_ms"] is not None


def _perturb(path: Path) -> None:
    """Noise of 30% of each weight's spread: a checkpoint that is signed, loads, and is worse."""
    import torch
    from safetensors.torch import load_file, save_file

    tensors = load_file(path)
    gen = torch.Generator().manual_seed(0)
    for name, t in tensors.items():
        if t.is_floating_point() and t.numel() > 1:
            noise = torch.randn(t.shape, generator=gen) * float(t.float().std()) * 0.3
            tensors[name] = (t.float() + noise).to(t.dtype)
    save_file(tensors, path, metadata={"format": "pt"})


def _listen(url: str, token: str, events: list) -> None:
    with httpx.stream(
        "GET", f"{url}/client/v4/accounts/local/workers/scripts/ro/tail",
        headers={"authorization": f"Bearer {token}"}, timeout=600,
    ) as r:  # fmt: skip
        for line in r.iter_lines():
            if line.strip():
                events.append(json.loads(line))
            if len([e for e in events if "rollout" in e]) >= 2:
                return  # closing the stream lets edge dev shut down
