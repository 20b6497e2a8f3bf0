"""Config files as wrangler reads them: wrangler.json / wrangler.jsonc / wrangler.toml, wrangler's
keys in typed structs, and the models folder found without configuration."""

import json
import logging
import textwrap
from pathlib import Path

import pytest

from runtime.bindings.d1 import D1DatabaseConfig
from runtime.bindings.kv import KVNamespaceConfig
from runtime.bindings.queues import QueueProducerConfig
from runtime.bindings.r2 import R2BucketConfig
from runtime.control import config as config_module
from runtime.control.config import (
    CONFIG_NAMES,
    INSTALLED_MODELS_DIR,
    AssetsConfig,
    ConfigError,
    DurableObjectBindingConfig,
    DurableObjectsConfig,
    MigrationConfig,
    ObservabilityConfig,
    ObservabilityLogsConfig,
    QueueConsumerConfig,
    QueuesConfig,
    RenamedClassConfig,
    TransferredClassConfig,
    TriggersConfig,
    find_config,
    load_config,
    parse_config,
    parse_jsonc,
    strip_jsonc,
)

REPO = Path(__file__).resolve().parents[2]

MINIMAL = '{"name": "w", "main": "worker.py", "compatibility_date": "2026-11-01"}'

# Every key of wrangler's this runtime parses, with comments and trailing commas.
FULL = """\
// wrangler.jsonc as `npm create cloudflare` writes it, and then some
{
  "$schema": "node_modules/wrangler/config-schema.json",
  "name": "full", /* the worker's name */
  "main": "worker.py",
  "compatibility_date": "2026-11-01",
  "compatibility_flags": ["python_workers",],
  "account_id": "acct",
  "vars": {"URL": "http://example.com/*x*/", "N": 3, "ON": true,},
  "ai": {"binding": "AI"},
  "services": [{"binding": "OTHER", "service": "other-worker"}],
  "limits": {"cpu_ms": 100},
  "observability": {"enabled": true, "head_sampling_rate": 1, "logs": {"invocation_logs": false}},
  "kv_namespaces": [
    {"binding": "CACHE", "id": "abc123", "preview_id": "def456"},  // trailing comma next
  ],
  "d1_databases": [
    {"binding": "DB", "database_name": "app", "database_id": "uuid-1", "migrations_dir": "db/migrations"}
  ],
  "r2_buckets": [{"binding": "FILES", "bucket_name": "files"}],
  "durable_objects": {"bindings": [{"name": "COUNTER", "class_name": "Counter"}]},
  "migrations": [
    {"tag": "v1", "new_sqlite_classes": ["Counter"]},
    {"tag": "v2", "renamed_classes": [{"from": "Counter", "to": "Tally"}],
     "transferred_classes": [{"from": "A", "from_script": "old", "to": "B"}]},
  ],
  "queues": {
    "producers": [{"binding": "JOBS", "queue": "jobs"}],
    "consumers": [{"queue": "jobs", "max_batch_size": 10, "max_batch_timeout": 5,
                   "max_retries": 3, "dead_letter_queue": "jobs-dlq"}],
  },
  "triggers": {"crons": ["*/5 * * * *", "0 0 * * *"]},
  "assets": {"directory": "./public", "binding": "ASSETS", "html_handling": "drop-trailing-slash",
             "not_found_handling": "single-page-application", "run_worker_first": ["/api/*"]},
  "edge": {"client_location": "Paris", "pops": ["FRA"]},
}
"""


# --- the JSONC reader ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"u": "http://x"}', {"u": "http://x"}),
        ('{"c": "/* not a comment */"}', {"c": "/* not a comment */"}),
        ('{"q": "a\\"//b"} // a comment', {"q": 'a"//b'}),
        ('{"p": "c:\\\\"} // the string ended at the quote', {"p": "c:\\"}),
        ('{"s": ",]", "t": ",}",}', {"s": ",]", "t": ",}"}),
        ("[1, 2, /* c */ 3, // x\n]", [1, 2, 3]),
        ('{"a": [1,],\n "b": {"c": 1,},\n}', {"a": [1], "b": {"c": 1}}),
        ('{"a": 1 /* a\nmultiline */, "b": 2}', {"a": 1, "b": 2}),
        ('{"a": "x*/y", "b": "//"}', {"a": "x*/y", "b": "//"}),
    ],
)
def test_jsonc_strips_comments_and_trailing_commas_but_never_inside_strings(text, expected):
    assert json.loads(strip_jsonc(text)) == expected


def test_jsonc_keeps_every_position_so_errors_name_the_line_and_column():
    text = '{\n  // a comment\n  "name": "w", /* two\n lines */\n  "main": worker.py,\n}'
    stripped = strip_jsonc(text)
    assert len(stripped) == len(text) and stripped.count("\n") == text.count("\n")
    with pytest.raises(ConfigError, match=r"wrangler\.jsonc: invalid JSON at line 5, column 11"):
        parse_jsonc(text)
    with pytest.raises(ConfigError, match=r"unterminated /\* comment at line 2, column 3"):
        parse_jsonc('{"a": 1,\n  /* never closed\n}')
    with pytest.raises(ConfigError, match="expected a JSON object at the top level"):
        parse_jsonc("[1, 2]")


def test_json_and_jsonc_both_allow_comments_and_the_syntax_follows_the_extension():
    text = MINIMAL[:-1] + ", // trailing\n}"
    assert parse_config(text, source="wrangler.json").name == "w"
    assert parse_config(text, source="x/wrangler.jsonc").name == "w"
    assert parse_config(text, syntax="json").name == "w"
    with pytest.raises(ConfigError, match="invalid TOML"):
        parse_config(text, source="wrangler.toml")


# --- wrangler's keys, typed ----------------------------------------------------------------------


def test_every_wrangler_key_is_parsed_into_its_struct(caplog):
    with caplog.at_level(logging.WARNING, logger="edge.config"):
        cfg = parse_config(FULL, source="wrangler.jsonc")
    assert "unknown key" not in caplog.text  # "$schema" included
    assert cfg.name == "full" and cfg.account_id == "acct" and cfg.compatibility_flags == ["python_workers"]
    assert cfg.vars == {"URL": "http://example.com/*x*/", "N": 3, "ON": True}
    assert cfg.ai.binding == "AI" and cfg.services[0].service == "other-worker" and cfg.limits.cpu_ms == 100
    assert cfg.observability == ObservabilityConfig(
        enabled=True, head_sampling_rate=1.0, logs=ObservabilityLogsConfig(invocation_logs=False)
    )
    assert cfg.bindings["kv_namespaces"] == [
        KVNamespaceConfig(binding="CACHE", id="abc123", preview_id="def456")
    ]
    assert cfg.bindings["d1_databases"] == [
        D1DatabaseConfig(
            binding="DB", database_name="app", database_id="uuid-1", migrations_dir="db/migrations"
        )
    ]
    assert cfg.bindings["r2_buckets"] == [R2BucketConfig(binding="FILES", bucket_name="files")]
    assert cfg.durable_objects == DurableObjectsConfig(
        bindings=[DurableObjectBindingConfig(name="COUNTER", class_name="Counter")]
    )
    assert cfg.migrations == [
        MigrationConfig(tag="v1", new_sqlite_classes=["Counter"]),
        MigrationConfig(
            tag="v2",
            renamed_classes=[RenamedClassConfig(from_="Counter", to="Tally")],
            transferred_classes=[TransferredClassConfig(from_="A", from_script="old", to="B")],
        ),
    ]
    assert cfg.bindings["queues.producers"] == [QueueProducerConfig(binding="JOBS", queue="jobs")]
    assert cfg.queues == QueuesConfig(
        consumers=[
            QueueConsumerConfig(
                queue="jobs",
                max_batch_size=10,
                max_batch_timeout=5.0,
                max_retries=3,
                dead_letter_queue="jobs-dlq",
            )
        ],
    )
    assert cfg.triggers == TriggersConfig(crons=["*/5 * * * *", "0 0 * * *"])
    assert cfg.assets == AssetsConfig(
        directory="./public",
        binding="ASSETS",
        html_handling="drop-trailing-slash",
        not_found_handling="single-page-application",
        run_worker_first=["/api/*"],
    )
    assert cfg.edge.client_location == "Paris" and cfg.edge.pops == ["FRA"]  # our table, in JSON too


def test_defaults_when_the_keys_are_absent():
    cfg = parse_config(MINIMAL, source="wrangler.json")
    assert cfg.compatibility_flags == [] and cfg.migrations == [] and cfg.triggers.crons == []
    assert cfg.bindings == {
        "kv_namespaces": [], "d1_databases": [], "r2_buckets": [], "queues.producers": [], "ratelimits": [],
        "workflows": [], "vectorize": [], "ai_search_namespaces": [], "ai_search": [],
    }  # fmt: skip
    assert cfg.durable_objects.bindings == [] and cfg.queues == QueuesConfig()
    assert cfg.assets is None and cfg.observability is None and cfg.ai is None
    assets = parse_config(MINIMAL[:-1] + ', "assets": {"directory": "p"}}', syntax="json").assets
    assert assets.html_handling == "auto-trailing-slash" and assets.not_found_handling == "none"
    assert assets.run_worker_first is False and assets.binding is None


def test_the_same_keys_in_wrangler_toml():
    cfg = parse_config(
        textwrap.dedent("""
        name = "t"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        compatibility_flags = ["python_workers"]
        [[kv_namespaces]]
        binding = "CACHE"
        id = "abc"
        [[d1_databases]]
        binding = "DB"
        database_name = "app"
        database_id = "uuid"
        [triggers]
        crons = ["* * * * *"]
        [assets]
        directory = "public"
        run_worker_first = true
        """),
        source="wrangler.toml",
    )
    assert (
        cfg.bindings["kv_namespaces"][0].id == "abc"
        and cfg.bindings["d1_databases"][0].database_name == "app"
    )
    assert cfg.triggers.crons == ["* * * * *"] and cfg.assets.run_worker_first is True


def _with(extra: str) -> str:
    return MINIMAL[:-1] + ", " + extra + "}"


@pytest.mark.parametrize(
    "extra, message",
    [
        ('"kv_namespaces": [{"binding": "K", "id": 5}]', r"kv_namespaces\.0\.id: expected `str`, got `int`"),
        ('"kv_namespaces": {"binding": "K"}', r"kv_namespaces: expected `array`, got `object`"),
        ('"d1_databases": [{"binding": "DB", "database_name": "x"}]', r"d1_databases\.0: .*`database_id`"),
        (
            '"r2_buckets": [{"binding": "F", "bucket_name": ["x"]}]',
            r"r2_buckets\.0\.bucket_name: expected `str`",
        ),
        (
            '"durable_objects": {"bindings": [{"name": "C"}]}',
            r"durable_objects\.bindings\.0: .*`class_name`",
        ),
        ('"migrations": [{"tag": 1}]', r"migrations\.0\.tag: expected `str`, got `int`"),
        (
            '"queues": {"consumers": [{"queue": "q", "max_batch_size": "ten"}]}',
            r"queues\.consumers\.0\.max_batch_size: expected `int \| null`, got `str`",
        ),
        ('"triggers": {"crons": "* * * * *"}', r"triggers\.crons: expected `array`, got `str`"),
        (
            '"assets": {"directory": "p", "html_handling": "sometimes"}',
            r"assets\.html_handling: invalid enum value 'sometimes'; expected one of 'auto-trailing-slash'",
        ),
        ('"assets": {"directory": "p", "run_worker_first": "yes"}', r"assets\.run_worker_first: expected"),
        (
            '"observability": {"enabled": "yes"}',
            r"observability\.enabled: expected `bool \| null`, got `str`",
        ),
        ('"compatibility_flags": "python_workers"', r"compatibility_flags: expected `array`, got `str`"),
        ('"edge": {"pops": "ICN"}', r"edge\.pops: expected `array \| null`, got `str`"),
    ],
)
def test_wrong_types_fail_with_the_key_path(extra, message):
    with pytest.raises(ConfigError, match=r"^wrangler\.jsonc: " + message):
        parse_config(_with(extra), source="wrangler.jsonc")


def test_wrong_types_fail_with_the_same_path_in_toml():
    text = 'name = "w"\nmain = "m.py"\ncompatibility_date = "2026-11-01"\n'
    text += '[[kv_namespaces]]\nbinding = "K"\nid = 5\n'
    with pytest.raises(ConfigError, match=r"kv_namespaces\.0\.id: expected `str`, got `int`"):
        parse_config(text, source="wrangler.toml")


def test_binding_names_must_be_identifiers_and_unique():
    with pytest.raises(
        ConfigError, match=r"kv_namespaces\.0\.binding: 'my-kv' is not a valid Python identifier"
    ):
        parse_config(_with('"kv_namespaces": [{"binding": "my-kv", "id": "x"}]'), syntax="json")
    with pytest.raises(ConfigError, match=r"r2_buckets\.0\.binding: 'AI' is already bound by ai\.binding"):
        parse_config(
            _with('"ai": {"binding": "AI"}, "r2_buckets": [{"binding": "AI", "bucket_name": "b"}]'),
            syntax="json",
        )


def test_unknown_keys_warn_with_their_path_in_json_and_in_lists(caplog):
    extra = (
        '"routes": ["example.com/*"], "kv_namespaces": [{"binding": "K", "id": "x", "surprise": 1}], '
        '"assets": {"directory": "p", "extra": 2}, "edge": {"nope": 3}, '
        '"queues": {"consumers": [{"queue": "q", "odd": 1}]}'
    )
    with caplog.at_level(logging.WARNING, logger="edge.config"):
        parse_config(_with(extra), source="wrangler.json")
    for key in ("routes", "kv_namespaces.0.surprise", "assets.extra", "edge.nope", "queues.consumers.0.odd"):
        assert f"unknown key {key!r} is ignored" in caplog.text, key


def test_neither_queues_nor_durable_objects_warn_as_not_simulated(caplog):
    with caplog.at_level(logging.WARNING, logger="edge.config"):
        parse_config(FULL, source="wrangler.jsonc")
    lines = [r.getMessage() for r in caplog.records]
    assert "unknown key" not in caplog.text
    assert not any("Durable Object" in line for line in lines)
    assert not any("migration" in line for line in lines)
    assert not any("queue" in line and "not simulated" in line for line in lines)  # queues run now
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="edge.config"):
        parse_config(MINIMAL, source="wrangler.json")
    assert "not simulated" not in caplog.text


# --- finding the config --------------------------------------------------------------------------


def _project(folder: Path, names) -> None:
    (folder / "worker.py").write_text("")
    for name in names:
        tag = name.replace(".", "_").replace("-", "_")
        if name.endswith(".toml"):
            (folder / name).write_text(
                f'name = "{tag}"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n'
            )
        else:
            (folder / name).write_text(MINIMAL.replace('"w"', f'"{tag}"'))


@pytest.mark.parametrize(
    "present, chosen",
    [
        (CONFIG_NAMES, "wrangler.json"),
        (("wrangler.jsonc", "wrangler.toml", "wrangler-like.toml"), "wrangler.jsonc"),
        (("wrangler.toml", "wrangler-like.toml"), "wrangler.toml"),
        (("wrangler-like.toml",), "wrangler-like.toml"),
    ],
)
def test_precedence_is_wranglers_then_ours(tmp_path, monkeypatch, caplog, present, chosen):
    assert CONFIG_NAMES == ("wrangler.json", "wrangler.jsonc", "wrangler.toml", "wrangler-like.toml")
    _project(tmp_path, present)
    monkeypatch.chdir(tmp_path)
    with caplog.at_level(logging.WARNING, logger="edge.config"):
        assert find_config() == tmp_path / chosen
        cfg = load_config()
    assert cfg.name == chosen.replace(".", "_").replace("-", "_")
    assert Path(cfg.base_dir) == tmp_path.resolve()
    assert (f"using {chosen}" in caplog.text) == (len(present) > 1)


def test_no_config_names_every_file_looked_for(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert find_config() is None
    with pytest.raises(ConfigError, match="wrangler.json, wrangler.jsonc, wrangler.toml, wrangler-like.toml"):
        load_config()


def test_config_path_accepts_every_format_by_extension(tmp_path):
    _project(tmp_path, ["wrangler.json", "wrangler.toml"])
    (tmp_path / "custom.jsonc").write_text("// mine\n" + MINIMAL[:-1] + ', "vars": {"A": "1",},}')
    assert load_config(tmp_path / "wrangler.json").name == "wrangler_json"
    assert load_config(str(tmp_path / "wrangler.toml")).name == "wrangler_toml"
    assert load_config(tmp_path / "custom.jsonc").vars == {"A": "1"}


def test_cli_commands_find_the_config_in_the_current_folder(tmp_path, monkeypatch, capsys):
    from runtime.cli import main

    monkeypatch.delenv("EDGE_MODELS_DIR", raising=False)
    _project(tmp_path, ["wrangler.jsonc"])
    monkeypatch.chdir(tmp_path)
    assert main(["models", "list"]) == 0  # no --config, no models_dir: the shipped catalog
    out = capsys.readouterr().out
    assert "@edge/moonshotai/kimi-k2-mini" in out and "integrity: verified" in out


# --- where models come from ----------------------------------------------------------------------


def test_models_dir_is_explicit_then_env_then_the_installation(tmp_path, monkeypatch):
    import runtime

    assert INSTALLED_MODELS_DIR == Path(runtime.__file__).resolve().parent.parent / "models"
    assert (INSTALLED_MODELS_DIR / "catalog.toml").is_file()
    monkeypatch.delenv("EDGE_MODELS_DIR", raising=False)
    monkeypatch.delenv("EDGE_TRUSTED_KEYS", raising=False)
    cfg = parse_config(MINIMAL, source="wrangler.json", base_dir=tmp_path)
    assert cfg.models_dir == INSTALLED_MODELS_DIR
    assert cfg.trusted_keys == [str(INSTALLED_MODELS_DIR / "keys" / "release.pub")]

    mine = tmp_path / "mine"
    (mine / "keys").mkdir(parents=True)
    (mine / "keys" / "me.pub").write_text("")
    monkeypatch.setenv("EDGE_MODELS_DIR", str(mine))
    cfg = parse_config(MINIMAL, source="wrangler.json", base_dir=tmp_path)
    assert cfg.models_dir == mine and cfg.trusted_keys == [str(mine / "keys" / "me.pub")]

    explicit = parse_config(
        _with('"edge": {"models_dir": "local"}'), source="wrangler.json", base_dir=tmp_path
    )
    assert explicit.models_dir == (tmp_path / "local").resolve()  # relative to the config, over the env
    assert explicit.trusted_keys is None  # no keys/ there: the engine's default store

    monkeypatch.setenv("EDGE_TRUSTED_KEYS", "/k.pub")
    assert cfg.trusted_keys is None  # the engine reads $EDGE_TRUSTED_KEYS itself
    given = parse_config(
        _with('"models": {"trusted_keys": ["a.pub"]}'), source="wrangler.json", base_dir=tmp_path
    )
    assert given.trusted_keys == [str((tmp_path / "a.pub").resolve())]


def test_missing_catalog_names_both_ways_to_set_it(tmp_path):
    from runtime.ai.catalog import load_catalog

    with pytest.raises(ConfigError, match=r"\[edge\] models_dir \(or \$EDGE_MODELS_DIR\)"):
        load_catalog(tmp_path)


# --- no engines without an AI binding ------------------------------------------------------------


def test_gpu_pops_default_only_with_an_ai_binding():
    assert parse_config(MINIMAL, syntax="json").gpu_pops == []
    assert parse_config(_with('"ai": {"binding": "AI"}'), syntax="json").gpu_pops == ["ICN", "FRA", "IAD"]
    assert parse_config(_with('"ai": {"binding": "AI"}, "edge": {"pops": []}'), syntax="json").gpu_pops == []
    assert parse_config(_with('"edge": {"pops": ["FRA"]}'), syntax="json").gpu_pops == ["FRA"]


def test_an_edge_without_gpu_pops_loads_no_engine_nor_needs_a_catalog(tmp_path, monkeypatch):
    from runtime.cli import build_edge

    monkeypatch.setenv("EDGE_MODELS_DIR", str(tmp_path))  # no catalog.toml there
    edge = build_edge(parse_config(MINIMAL, syntax="json"))
    assert edge.nodes == {} and edge.models() == []
    edge.close()


def test_pops_empty_with_an_ai_binding_fails_ai_calls_with_3040(monkeypatch):
    from runtime.ai.catalog import catalog_if_any
    from runtime.ai.service import AIService
    from runtime.cli import build_edge
    from workers import AIError

    monkeypatch.delenv("EDGE_MODELS_DIR", raising=False)
    cfg = parse_config(_with('"ai": {"binding": "AI"}, "edge": {"pops": []}'), syntax="json")
    edge = build_edge(cfg)
    catalog = catalog_if_any(cfg)
    ai = AIService(edge, {name: e.schema for name, (e, _) in catalog.items()})
    assert edge.nodes == {}
    with pytest.raises(AIError, match=r"^3040: no PoP serving '@edge/moonshotai/kimi-k2-mini' is up"):
        ai.prepare("@edge/moonshotai/kimi-k2-mini", {"prompt": "x"}, "local")
    with pytest.raises(AIError, match="^5007: no such model"):  # not in the catalog: still 5007
        ai.prepare("@edge/nobody/nothing", {"prompt": "x"}, "local")
    edge.close()


def test_module_constants_match_the_readme():
    assert config_module.DEFAULT_POPS == ["ICN", "FRA", "IAD"]
    assert config_module.MODELS_DIR_ENV == "EDGE_MODELS_DIR"
    assert (REPO / "models").resolve() == INSTALLED_MODELS_DIR  # this checkout is the installation


def test_an_unknown_key_says_which_known_key_it_is_close_to(caplog):
    # issue 57, item 3: `"ia": {...}` warned and then the worker failed on env.AI with no hint
    extra = (
        '"ia": {"binding": "AI"}, "kv_namespace": [], '
        '"d1_databases": [{"binding": "DB", "database_id": "x", "database_name": "n", '
        '"previw_database_id": "p"}], '
        '"edge": {"client_locaton": "Paris", "zzz": 1}'
    )
    with caplog.at_level(logging.WARNING, logger="edge.config"):
        parse_config(_with(extra), source="wrangler.json")
    text = caplog.text
    assert "unknown key 'ia' is ignored; did you mean 'ai'?" in text
    assert "unknown key 'kv_namespace' is ignored; did you mean 'kv_namespaces'?" in text
    assert (
        "unknown key 'd1_databases.0.previw_database_id' is ignored; did you mean 'preview_database_id'?"
        in text
    )
    assert "unknown key 'edge.client_locaton' is ignored; did you mean 'client_location'?" in text
    assert "unknown key 'edge.zzz' is ignored\n" in text  # nothing close: no guess
