"""`edge models eval`: perplexity, change against the baseline, greedy agreement, KV bytes."""

import json

import pytest

from quality.perplexity import evaluate
from runtime.cli import main as edge
from tests.conftest import REPO


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("eval") / "heldout.txt"
    path.write_text((REPO / "models" / "eval" / "heldout.txt").read_text()[:12000])
    return path


def test_rows_per_setting_and_context(tiny_model_dir, text):
    rows = evaluate(
        tiny_model_dir, ["auto", "int8", "int4"], [64, 128], text=text, max_windows=3, allow_unsigned=True
    )
    assert [(r.kv_cache_dtype, r.context) for r in rows] == [
        ("auto", 64),
        ("auto", 128),
        ("int8", 64),
        ("int8", 128),
        ("int4", 64),
        ("int4", 128),
    ]
    base = rows[0]
    assert base.ppl_change_pct == 0 and base.greedy_agreement == 1 and base.windows == 3
    assert base.tokens_scored == 3 * 63
    by = {(r.kv_cache_dtype, r.context): r for r in rows}
    assert by[("int8", 64)].kv_bytes_per_token < by[("auto", 64)].kv_bytes_per_token / 3
    assert by[("int4", 64)].kv_bytes_per_token < by[("int8", 64)].kv_bytes_per_token
    # 8-bit KV is close to lossless; 4-bit costs more (a random model magnifies both)
    assert abs(by[("int8", 128)].ppl_change_pct) < abs(by[("int4", 128)].ppl_change_pct) + 1e-9
    assert by[("int8", 128)].greedy_agreement > 0.9


def test_cli_json_and_errors(tiny_model_dir, text, capsys):
    def run(*extra: str) -> int:
        return edge(["models", "eval", str(tiny_model_dir), "--text", str(text), "--allow-unsigned", *extra])

    assert run("--kv", "auto,fp8", "--contexts", "64", "--max-windows", "2", "--json") == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["kv_cache_dtype"] for r in rows] == ["auto", "fp8"]
    assert run("--contexts", "64,lots") == 2
    assert "--contexts" in capsys.readouterr().err
    assert run("--kv", "int3", "--contexts", "64") == 2
    assert "int3" in capsys.readouterr().err
    # without --allow-unsigned an unsigned model is refused, saying how to fix it
    assert edge(["models", "eval", str(tiny_model_dir), "--text", str(text), "--contexts", "64"]) == 2
    assert "edge models sign" in capsys.readouterr().err
