"""`.dev.vars` as wrangler reads it (dotenv): bare, quoted and multi-line values, comments, bad
lines reported by number without their content, `.env` when there is no `.dev.vars`."""

from __future__ import annotations

import logging

from runtime.control.dev_vars import parse_dev_vars, read_dev_vars


def test_the_dotenv_shapes_wrangler_accepts():
    text = (
        "# a comment\n\nA=1\nexport B = two words  # trailing comment\nC='single # kept'\n"
        'D="dq \\"q\\" \\\\ \\t end"\nE="first\nsecond"\nF=\nG=a#b\n'
    )
    assert parse_dev_vars(text) == {
        "A": "1",
        "B": "two words",
        "C": "single # kept",
        "D": 'dq "q" \\ \t end',
        "E": "first\nsecond",
        "F": "",
        "G": "a#b",
    }


def test_a_bad_line_is_skipped_and_named_by_number_never_by_content(caplog):
    with caplog.at_level(logging.WARNING, logger="edge.config"):
        found = parse_dev_vars('OK=1\nthis-is-the-secret-line\n1BAD=x\nUNCLOSED="hunter2\n', "f")
    assert found == {"OK": "1"}
    assert "f:2" in caplog.text and "f:3" in caplog.text and "f:4" in caplog.text
    assert "this-is-the-secret-line" not in caplog.text and "hunter2" not in caplog.text


def test_dev_vars_wins_over_env_and_none_is_nothing(tmp_path):
    assert read_dev_vars(tmp_path) == (None, {})
    (tmp_path / ".env").write_text("X=from-env\n")
    assert read_dev_vars(tmp_path) == (tmp_path / ".env", {"X": "from-env"})
    (tmp_path / ".dev.vars").write_text("X=from-dev-vars\n")
    assert read_dev_vars(tmp_path) == (tmp_path / ".dev.vars", {"X": "from-dev-vars"})


def test_a_local_secret_never_shadows_a_binding_the_assets_one_included(tmp_path, caplog):
    from runtime.control.config import load_config
    from runtime.host.registry import dev_spec

    (tmp_path / "worker.py").write_text("")
    (tmp_path / "public").mkdir()
    (tmp_path / "wrangler.toml").write_text(
        'name = "w"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n'
        'assets = { directory = "public", binding = "ASSETS" }\n'
        'kv_namespaces = [{ binding = "KV", id = "kv1" }]\n'
    )
    (tmp_path / ".dev.vars").write_text("ASSETS=x\nKV=y\nTOKEN=z\n")
    with caplog.at_level(logging.WARNING):
        spec = dev_spec(load_config(tmp_path / "wrangler.toml"), None)
    assert spec.local_secrets == {"TOKEN": "z"}
    assert "ASSETS, KV also name a binding" in caplog.text
