"""How an operator puts a PoP in front of an OpenAI-compatible upstream (vLLM, SGLang, llama-server,
another edge dev): a topology PoP entry's `upstream` table, read once into typed structs and checked
before anything starts, so a bad entry fails `edge dev` with its PoP and key named.

    [[pop]]
    code = "FRA"  # ... city, country, continent, lat, lon, timezone, gpus as for any PoP
    [pop.upstream]
    backend = "openai"
    base_url = "http://10.0.0.5:8000"  # the server's /v1/... paths hang off this
    api_key_env = "VLLM_API_KEY"  # the NAME of the variable holding the key, never the key
    cache_salt = true  # vLLM's per-request prefix-cache salt (set from the tenant's salt)
    [[pop.upstream.models]]
    name = "@edge/moonshotai/kimi-k2-mini"  # the catalog name workers call
    upstream_model = "moonshotai/Kimi-K2-Instruct"  # the name the upstream serves it under
    weights = "fp8"  # as the operator states them: shown in served_by and /cdn-cgi/edge/pops
    kv_cache = "fp8_e4m3"
"""

from __future__ import annotations

import os
from typing import Literal
from urllib.parse import urlsplit

import msgspec

MAX_UPSTREAM_MODELS = 64
MAX_CONCURRENT = 4096
MAX_LABEL_CHARS = 64


class UpstreamModel(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    name: str  # the catalog name a call names
    upstream_model: str  # the model name in the upstream's own /v1/models
    weights: str  # weight format as served upstream (e.g. "fp8", "int4-awq"), stated by the operator
    kv_cache: str = "auto"  # KV-cache format as served upstream (e.g. "fp8_e4m3")


class UpstreamConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    backend: Literal["openai"]
    base_url: str
    models: list[UpstreamModel]
    api_key_env: str | None = None
    cache_salt: bool = False  # the upstream takes vLLM's `cache_salt` field
    max_concurrent: int = 64  # requests forwarded at once; the rest wait in this PoP's fair queue
    timeout_s: float = 600.0  # longest wait for the upstream's next bytes
    connect_timeout_s: float = 5.0
    health_path: str = "/v1/models"  # GET {base_url}{health_path}: 200 means up ("/health" on vLLM)

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def model(self, name: str) -> UpstreamModel | None:
        return next((m for m in self.models if m.name == name), None)


def check_upstream(code: str, cfg: UpstreamConfig) -> None:
    """Raise ValueError naming the PoP and key when `cfg` cannot be used as written."""
    where = f"PoP {code}: upstream"
    url = urlsplit(cfg.base_url)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise ValueError(
            f"{where}.base_url must be an http(s) URL such as http://10.0.0.5:8000, got {cfg.base_url!r}"
        )
    if url.query or url.fragment:
        raise ValueError(f"{where}.base_url takes no query or fragment, got {cfg.base_url!r}")
    if cfg.base_url.rstrip("/").endswith("/v1"):
        raise ValueError(f"{where}.base_url is the part before /v1 (it is added), got {cfg.base_url!r}")
    if not cfg.models or len(cfg.models) > MAX_UPSTREAM_MODELS:
        raise ValueError(f"{where}.models: name 1 to {MAX_UPSTREAM_MODELS} models the upstream serves")
    names = [m.name for m in cfg.models]
    if len(set(names)) != len(names):
        raise ValueError(f"{where}.models names a catalog model twice")
    for i, m in enumerate(cfg.models):
        for key in ("name", "upstream_model", "weights", "kv_cache"):
            value = getattr(m, key)
            if not value.strip() or (key in ("weights", "kv_cache") and len(value) > MAX_LABEL_CHARS):
                raise ValueError(f"{where}.models[{i}].{key} must be a non-empty label, got {value!r}")
    if cfg.api_key_env is not None:
        if not cfg.api_key_env.isidentifier():
            raise ValueError(
                f"{where}.api_key_env names an environment variable (e.g. VLLM_API_KEY), not the key itself"
            )
        if not os.environ.get(cfg.api_key_env):
            raise ValueError(f"{where}.api_key_env: ${cfg.api_key_env} is not set in this environment")
    if not 1 <= cfg.max_concurrent <= MAX_CONCURRENT:
        raise ValueError(f"{where}.max_concurrent must be in [1, {MAX_CONCURRENT}], got {cfg.max_concurrent}")
    if not (0 < cfg.timeout_s <= 3600 and 0 < cfg.connect_timeout_s <= 60):
        raise ValueError(f"{where}: timeout_s must be in (0, 3600] and connect_timeout_s in (0, 60]")
    if not cfg.health_path.startswith("/"):
        raise ValueError(f"{where}.health_path must start with '/', got {cfg.health_path!r}")
