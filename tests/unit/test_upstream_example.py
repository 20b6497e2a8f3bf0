"""examples/upstream: the config parses, its PoP names backend openai, and both launch commands are
the ones its comments give; without the API key's variable set, start-up says which one."""

import msgspec
import pytest

from runtime.cli.servers import load_topology
from runtime.control.config import ConfigError, load_config
from tests.integration.dev_server import REPO

EXAMPLE = REPO / "examples/upstream"


@pytest.mark.parametrize(
    ("topology", "key_env", "command"),
    [
        ("topology.toml", "VLLM_API_KEY", "vllm serve moonshotai/Kimi-K2-Instruct --tensor-parallel-size 8"),
        ("topology-sglang.toml", "SGLANG_API_KEY", "python -m sglang.launch_server --model-path"),
    ],
)
def test_the_example_names_an_openai_upstream(monkeypatch, topology, key_env, command):
    monkeypatch.setenv(key_env, "a-key")
    config = load_config(str(EXAMPLE / "wrangler-like.toml"))
    config = msgspec.structs.replace(config, edge=msgspec.structs.replace(config.edge, topology=topology))
    fra = load_topology(config).pop("FRA")
    assert fra.upstream.backend == "openai" and fra.upstream.api_key_env == key_env
    assert (
        fra.upstream.model("@edge/moonshotai/kimi-k2-instruct").upstream_model
        == "moonshotai/Kimi-K2-Instruct"
    )
    assert "FRA" in config.edge.pops
    assert command in (EXAMPLE / topology).read_text()

    monkeypatch.delenv(key_env)
    with pytest.raises(ConfigError, match=f"\\${key_env} is not set"):
        load_topology(config)
