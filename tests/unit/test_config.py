import logging

import pytest

from runtime.control.config import ConfigError, load_config, parse_config

GOOD = """
name = "w"
main = "worker.py"
compatibility_date = "2026-11-01"

[ai]
binding = "AI"

[vars]
A = "x"
N = 3

[edge]
client_location = "Paris"
pops = ["FRA"]

[edge.network]
base_ms = 1.5
"""


def test_good_config_is_typed_and_paths_resolve(tmp_path):
    (tmp_path / "worker.py").write_text("")
    (tmp_path / "wrangler-like.toml").write_text(GOOD)
    cfg = load_config(tmp_path / "wrangler-like.toml")
    assert cfg.name == "w" and cfg.ai.binding == "AI" and cfg.vars == {"A": "x", "N": 3}
    assert cfg.edge.client_location == "Paris" and cfg.edge.pops == ["FRA"]
    assert cfg.edge.network.base_ms == 1.5 and cfg.edge.network.inflation == 2.0
    assert cfg.main_path == (tmp_path / "worker.py").resolve()


def test_malformed_toml_names_the_line():
    with pytest.raises(ConfigError, match=r"line 2"):
        parse_config('name = "w"\nmain = \n')


def test_wrong_type_names_the_key_path():
    with pytest.raises(ConfigError, match=r"edge\.network\.base_ms: expected `float`, got `str`"):
        parse_config(GOOD.replace("base_ms = 1.5", 'base_ms = "fast"'))
    with pytest.raises(ConfigError, match=r"edge\.pops\.0: expected `str`, got `int`"):
        parse_config(GOOD.replace('pops = ["FRA"]', "pops = [1]"))


def test_missing_required_key_is_named():
    with pytest.raises(ConfigError, match="main"):
        parse_config('name = "w"\ncompatibility_date = "2026-11-01"\n')


def test_unknown_keys_warn_with_their_path(caplog):
    with caplog.at_level(logging.WARNING, logger="edge.config"):
        parse_config("surprise = 1\n" + GOOD + "\nlatency = 3\n[edge.extra]\nx = 1\n")
    text = caplog.text
    assert "'surprise'" in text and "'edge.network.latency'" in text and "'edge.extra'" in text


def test_bad_compatibility_date_and_missing_main(tmp_path):
    with pytest.raises(ConfigError, match="compatibility_date"):
        parse_config(GOOD.replace("2026-11-01", "yesterday"))
    (tmp_path / "wrangler-like.toml").write_text(GOOD)
    with pytest.raises(ConfigError, match="main: 'worker.py' does not exist"):
        load_config(tmp_path / "wrangler-like.toml")
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")


def test_catalog_target_errors_name_the_model_and_field(tmp_path, tiny_model_dir):
    from runtime.ai.catalog import load_catalog

    (tmp_path / "tiny").symlink_to(tiny_model_dir)
    (tmp_path / "catalog.toml").write_text(
        '[[model]]\nname = "@edge/t/tiny"\npath = "tiny"\ntarget = { model = "kimi-k2", gpu = "B200" }\n'
    )
    with pytest.raises(ConfigError, match=r"'@edge/t/tiny': target: unknown GPU type 'B200'"):
        load_catalog(tmp_path)
    (tmp_path / "catalog.toml").write_text(
        '[[model]]\nname = "@edge/t/tiny"\npath = "tiny"\ntarget = { model = "glm-4.5", kv = "int4" }\n'
    )
    entry, _ = load_catalog(tmp_path)["@edge/t/tiny"]
    assert entry.target.model == "glm-4.5" and entry.target.kv == "int4"


def test_pop_serve_names_an_unknown_model_instead_of_crashing(tmp_path, capsys):
    from runtime import cli
    from tests.conftest import REPO

    (tmp_path / "w.py").write_text("")
    (tmp_path / "wrangler-like.toml").write_text(
        'name = "n"\nmain = "w.py"\ncompatibility_date = "2026-11-01"\n[edge]\npops = ["ICN"]\n'
        f'models = ["@edge/nope"]\nmodels_dir = "{REPO / "models"}"\n'
    )
    code = cli.main(["pop", "serve", "--name", "ICN", "--config", str(tmp_path / "wrangler-like.toml")])
    err = capsys.readouterr().err
    assert code == 2 and "edge.models: unknown model(s) @edge/nope" in err
    assert "@edge/moonshotai/kimi-k2-mini" in err  # says what the catalog has


def test_edge_accounts_tables_are_typed_and_checked(caplog):
    accounts = "\n[edge.accounts.free]\nrpm = 3\ntpm = 1000\n[edge.accounts.paid]\nweight = 4\n"
    with caplog.at_level(logging.WARNING, logger="edge.config"):
        cfg = parse_config(GOOD + accounts)
    assert caplog.text == ""  # tables by name are not unknown keys
    free, paid = cfg.edge.accounts["free"], cfg.edge.accounts["paid"]
    assert (free.rpm, free.tpm, free.weight, free.kv_share) == (3, 1000, 1.0, 1.0)
    assert (paid.rpm, paid.tpm, paid.weight) == (300, None, 4.0)


@pytest.mark.parametrize(
    "table, message",
    [
        ("[edge.accounts.free]\nrmp = 3", r"edge\.accounts\.free: unknown key 'rmp'; the keys are rpm, tpm"),
        ("[edge.accounts.free]\nrpm = 0", r"edge\.accounts\.free: rpm: 0; expected a whole number"),
        ('[edge.accounts.free]\nweight = "x"', r"edge\.accounts\.free\.weight: expected `float`"),
        ("[edge.accounts.free]\nkv_share = 1.5", r"edge\.accounts\.free: kv_share: 1\.5; expected"),
        ("[edge.accounts.Free]\nrpm = 3", r"edge\.accounts\.Free: account name 'Free': use 1-63"),
        ("[edge.accounts]\nfree = 3", r"edge\.accounts\.free: expected a table of rpm"),
    ],
)
def test_a_bad_edge_accounts_table_is_refused_naming_the_account(table, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(GOOD + "\n" + table + "\n")


def test_ai_gateways_are_configured_by_id_and_checked():
    cfg = parse_config(GOOD + "\n[edge.ai_gateways.shop]\ncache_ttl = 60\nrate_limit = 10\n")
    shop = cfg.edge.ai_gateways["shop"]
    assert (shop.cache_ttl, shop.collect_logs, shop.rate_limit, shop.rate_limit_period_s) == (
        60,
        True,
        10,
        60.0,
    )


@pytest.mark.parametrize(
    "table, message",
    [
        ("[edge.ai_gateways.shop]\ncache_tll = 3", r"edge\.ai_gateways\.shop.*cache_tll"),
        ("[edge.ai_gateways.shop]\ncache_ttl = -1", r"edge\.ai_gateways\.shop\.cache_ttl: give 0 to"),
        ("[edge.ai_gateways.shop]\nrate_limit = 0", r"edge\.ai_gateways\.shop\.rate_limit: give 1 to"),
        ('[edge.ai_gateways."a b"]\nrate_limit = 1', r"edge\.ai_gateways\.a b: a gateway id is 1 to 64"),
    ],
)
def test_a_bad_ai_gateway_table_is_refused_naming_it(table, message):
    with pytest.raises(ConfigError, match=message):
        parse_config(GOOD + "\n" + table + "\n")
