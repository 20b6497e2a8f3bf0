"""Speculation in serving: the catalog's per-model default (over $EDGE_SPECULATIVE) and its bad
values, a request's `"speculative": false` in Workers AI inputs and OpenAI bodies, the per-request
drafted/accepted counts the latency account carries, the Prometheus series, and the back-off of a
sequence whose drafts are rarely kept."""

from __future__ import annotations

import shutil

import pytest
from prometheus_client import generate_latest

from engine.llm import LLM
from engine.sampling import SamplingParams
from engine.speculation import AcceptanceBackoff, SpeculativeConfig, parse_speculative
from runtime.ai.catalog import load_catalog, model_spec
from runtime.ai.params import chat_request
from runtime.ai.refusals import InputError
from runtime.control.config import ConfigError
from runtime.control.metrics import Metrics
from tests.unit.test_simulator import SHIPPED_KIMI
from tests.unit.test_speculation import REPEATS

ENTRY = """[[model]]
name = "@edge/test/kimi"
path = "kimi-k2-mini"
{extra}
"""


def _catalog(tmp_path, extra: str):
    shutil.copytree(SHIPPED_KIMI, tmp_path / "kimi-k2-mini", dirs_exist_ok=True)
    (tmp_path / "catalog.toml").write_text(ENTRY.format(extra=extra))
    return load_catalog(tmp_path)


class _Config:
    trusted_keys = None

    class models:  # noqa: N801 - the config's attribute
        allow_unsigned = False


def test_the_catalog_sets_a_models_speculation_and_refuses_bad_values(tmp_path):
    catalog = _catalog(tmp_path, 'speculative = { method = "ngram", tokens = 3 }')
    spec = model_spec(_Config, "@edge/test/kimi", catalog)
    assert spec.speculative == "ngram:3" and parse_speculative(spec.speculative) == SpeculativeConfig(
        num_tokens=3
    )
    drafted = model_spec(_Config, "@edge/test/kimi", _catalog(tmp_path, 'speculative = { method = "mtp" }'))
    assert parse_speculative(drafted.speculative) == SpeculativeConfig(num_tokens=1, method="mtp")
    two = model_spec(
        _Config, "@edge/test/kimi", _catalog(tmp_path, 'speculative = { method = "mtp", tokens = 2 }')
    )
    assert parse_speculative(two.speculative) == SpeculativeConfig(num_tokens=2, method="mtp")
    off = model_spec(_Config, "@edge/test/kimi", _catalog(tmp_path, 'speculative = { method = "off" }'))
    assert parse_speculative(off.speculative) is None
    assert model_spec(_Config, "@edge/test/kimi", _catalog(tmp_path, "")).speculative == "env"
    with pytest.raises(ConfigError, match="speculative.tokens must be 1-14"):
        _catalog(tmp_path, 'speculative = { method = "ngram", tokens = 40 }')
    with pytest.raises(ConfigError, match="method"):
        _catalog(tmp_path, 'speculative = { method = "eagle" }')


def test_a_request_turns_speculation_off_and_a_bad_value_names_the_parameter():
    assert chat_request({"prompt": "hi"}, model="m").params.speculative is True
    assert chat_request({"prompt": "hi", "speculative": False}, model="m").params.speculative is False
    with pytest.raises(InputError, match="speculative"):
        chat_request({"prompt": "hi", "speculative": "no"}, model="m")


def test_each_request_says_what_was_drafted_and_kept_and_an_opted_out_one_drafts_nothing():
    llm = LLM(SHIPPED_KIMI, device="cpu", speculative="ngram")
    params = SamplingParams(temperature=0, max_tokens=32)
    on = llm.generate([REPEATS], params)[0].metrics
    assert 0 < on.accepted_tokens <= on.draft_tokens
    off = llm.generate([REPEATS], SamplingParams(temperature=0, max_tokens=32, speculative=False))[0]
    assert off.metrics.draft_tokens == 0 and off.metrics.accepted_tokens == 0
    stats = llm.engine.stats()
    assert (stats.draft_tokens, stats.accepted_tokens) == (on.draft_tokens, on.accepted_tokens)


def test_prometheus_carries_drafted_and_accepted_tokens_per_model():
    metrics = Metrics()
    metrics.ai_speculation("@edge/test/kimi", 10, 7)
    text = generate_latest(metrics.public).decode()
    assert 'edge_ai_speculative_tokens_total{kind="drafted",model="@edge/test/kimi"} 10.0' in text
    assert 'edge_ai_speculative_tokens_total{kind="accepted",model="@edge/test/kimi"} 7.0' in text


def test_a_sequence_whose_drafts_are_rarely_kept_pauses_drafting_then_tries_again():
    backoff = AcceptanceBackoff(SpeculativeConfig(backoff_window=4, backoff_below=0.2, backoff_steps=3))
    for _ in range(3):
        backoff.record(5, 0)
        assert not backoff.paused()
    backoff.record(5, 3)  # 3 of 20 kept: under 20%
    assert [backoff.paused() for _ in range(4)] == [True, True, True, False]
    for _ in range(4):
        backoff.record(5, 1)  # 4 of 20: not under 20%
    assert not backoff.paused()
