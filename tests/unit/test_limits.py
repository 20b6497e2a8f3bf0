"""Worker limits: one set of ranges (runtime/control/limits.py), and the same verdicts whether a limit
comes from wrangler-like.toml or from the deploy API."""

import msgspec
import pytest

from runtime.control.config import ConfigError, parse_config
from runtime.control.limits import BOUNDS, LimitError, Limits, validate
from runtime.isolate.process import IsolateLimits
from runtime.routes.deploy import parse_upload

TOML = 'name = "w"\nmain = "w.py"\ncompatibility_date = "2026-11-01"\n[limits]\n'


def test_defaults_and_the_isolate_limits_they_make():
    limits = validate({})
    assert limits == Limits(cpu_ms=30_000, memory_mb=128, subrequests=50)
    assert limits.isolate() == IsolateLimits(cpu_ms=30_000, memory_mb=128, sandbox=True)
    assert validate({"cpu_ms": 400, "other": "ignored"}).cpu_ms == 400


@pytest.mark.parametrize(
    ("key", "low", "high"), [("cpu_ms", 1, 300_000), ("memory_mb", 16, 1024), ("subrequests", 1, 1000)]
)
def test_each_range_is_inclusive_and_nothing_outside_it_passes(key, low, high):
    assert BOUNDS[key][:2] == (low, high)
    assert getattr(validate({key: low}), key) == low and getattr(validate({key: high}), key) == high
    for bad in (low - 1, high + 1, 0, -1, 10**12):
        with pytest.raises(LimitError, match=rf"^limits\.{key}: must be an integer between {low} and {high}"):
            validate({key: bad})


def test_the_message_names_the_key_path_the_range_and_the_value():
    with pytest.raises(LimitError) as err:
        validate({"cpu_ms": 10**12})
    assert str(err.value) == "limits.cpu_ms: must be an integer between 1 and 300000, got 1000000000000"
    with pytest.raises(LimitError, match=r"^config\.memory_mb: .* got 0$"):  # 0 is not "unlimited"
        validate({"memory_mb": 0}, "config")


@pytest.mark.parametrize("value", [True, False, 1.0, 30000.0, "30000", None, [1]])
def test_only_integers_are_limits_and_bools_are_not_integers(value):
    for key in BOUNDS:
        with pytest.raises(LimitError, match=rf"limits\.{key}: must be an integer"):
            validate({key: value})


def _toml_verdict(key, value) -> str | None:
    try:
        parse_config(TOML + f"{key} = {_toml(value)}\n")
    except ConfigError as exc:
        return str(exc)
    return None


def _toml(value) -> str:
    return "true" if value is True else "false" if value is False else msgspec.json.encode(value).decode()


def _deploy_verdict(key, value) -> str | None:
    body = {"main": "w.py", "files": {"w.py": ""}, "config": {key: value}}
    try:
        parse_upload(msgspec.json.encode(body))
    except ValueError as exc:
        return str(exc)
    return None


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cpu_ms", 1),
        ("cpu_ms", 300_000),
        ("cpu_ms", 300_001),
        ("cpu_ms", 10**12),
        ("cpu_ms", 0),
        ("cpu_ms", True),
        ("cpu_ms", 2.5),
        ("cpu_ms", "10"),
        ("memory_mb", 0),
        ("memory_mb", 15),
        ("memory_mb", 16),
        ("memory_mb", 1024),
        ("memory_mb", 1025),
        ("memory_mb", False),
        ("subrequests", 0),
        ("subrequests", 1000),
        ("subrequests", 1001),
        ("subrequests", -5),
    ],
)
def test_toml_and_the_deploy_api_give_the_same_verdict(key, value):
    toml, deploy = _toml_verdict(key, value), _deploy_verdict(key, value)
    expected_ok = type(value) is int and BOUNDS[key].low <= value <= BOUNDS[key].high
    assert (toml is None, deploy is None) == (expected_ok, expected_ok), (toml, deploy)
    if not expected_ok:
        assert f"limits.{key}:" in toml and f"config.{key}:" in deploy
        if type(value) is int:  # the same words from the same place
            assert toml.split(f"limits.{key}:")[1] == deploy.split(f"config.{key}:")[1].split(";")[0]


def test_toml_errors_name_the_file():
    with pytest.raises(ConfigError, match=r"^wrangler-like\.toml: limits\.cpu_ms: must be an integer"):
        parse_config(TOML + "cpu_ms = 1000000000000\n")


def test_the_deploy_config_refuses_unknown_keys_and_checks_bindings():
    ok = {"main": "w.py", "files": {"w.py": ""}}
    assert "unknown field `cpu_time`" in _deploy_raw({**ok, "config": {"cpu_time": 5}})
    assert "config.ai_binding" in _deploy_raw({**ok, "config": {"ai_binding": "not-an-identifier"}})
    assert "config.services" in _deploy_raw({**ok, "config": {"services": {"a b": "helper"}}})
    upload, limits = parse_upload(msgspec.json.encode({**ok, "config": {"cpu_ms": 400, "vars": {"A": 1}}}))
    assert limits == Limits(cpu_ms=400) and upload.config.vars == {"A": 1}


def _deploy_raw(body) -> str:
    with pytest.raises(ValueError) as err:
        parse_upload(msgspec.json.encode(body))
    return str(err.value)
