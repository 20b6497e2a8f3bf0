"""The binding kinds are listed once (runtime.bindings.kinds.KINDS): each has its config key read by
the config, its SDK client and its deploy-upload field, and a kind added as a new kind is added (its
kind declaration, its SDK client and its line in the list; nothing else) flows through config ->
refs -> spec -> the isolate's client -> store call."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from runtime.bindings import BindingRef, BindingStores, kinds
from runtime.bindings.kind import BindingKind
from runtime.control.config import parse_config
from runtime.host.registry import dev_spec
from runtime.isolate.inside.main import sdk_client
from runtime.routes.deploy import DeployConfig

EXTRA = {  # what a kind needs beyond its id
    "ratelimit": {"simple": {"limit": 5, "period": 60}},
    "workflow": {"class_name": "MyWorkflow"},
}
MINIMAL = '{"name": "w", "main": "worker.py", "compatibility_date": "2026-11-01"'


def test_every_kind_has_its_config_key_sdk_client_and_deploy_field():
    for k in kinds.KINDS:
        client = sdk_client(k.client)  # the SDK class the isolate builds for it
        assert client.__module__.startswith("workers."), k.client
        *parents, leaf = k.config_key.split(".")
        entry = {k.env_key: "X", **{f: "v" for f in k.id_fields if f != "binding"}, **EXTRA.get(k.name, {})}
        nested: dict = {leaf: [entry]}
        for part in reversed(parents):
            nested = {part: nested}
        config = parse_config(
            MINIMAL + ", " + msgspec.json.encode(nested).decode()[1:-1] + "}", syntax="json"
        )
        assert len(config.bindings[k.config_key]) == 1, k.config_key
        upload = msgspec.convert(nested, DeployConfig)
        stored = kinds.tables_of(msgspec.to_builtins(upload))[k.config_key][0]
        assert k.env_name(stored) == "X" and k.env_name(config.bindings[k.config_key][0]) == "X"
        sent = kinds.upload_payload(config.bindings)  # what edge deploy sends: the upload reads it back
        assert kinds.tables_of(msgspec.to_builtins(msgspec.convert(sent, DeployConfig)))[k.config_key] == [
            stored
        ]


class EchoConfig(msgspec.Struct, kw_only=True):
    binding: str
    thing: str


class EchoUpload(msgspec.Struct, forbid_unknown_fields=True):
    binding: str
    thing: str


class EchoStore:
    def __init__(self, root):
        self.root = root

    def call(self, account, ident, method, args, kwargs):
        return [account, ident, method, args]

    def close(self):
        pass


def test_a_kind_added_to_the_list_flows_from_config_to_a_store_call(tmp_path, monkeypatch):
    echo = BindingKind(
        "echo", "echo_things", EchoConfig, EchoUpload, ("thing",), lambda d, q: EchoStore(d),
        "workers.kv:KVNamespace",  # a test kind borrows an SDK client: the isolate only imports it
    )  # fmt: skip
    monkeypatch.setattr(kinds, "KINDS", [*kinds.KINDS, echo])
    config = parse_config(MINIMAL + ', "echo_things": [{"binding": "E", "thing": "t1"}]}', syntax="json")
    assert config.bindings["echo_things"] == [EchoConfig(binding="E", thing="t1")]
    spec = dev_spec(config, None)
    assert spec.bindings == {"E": BindingRef("echo", "t1")}
    assert kinds.sdk_clients(spec.bindings) == {"E": "workers.kv:KVNamespace"}
    stores = BindingStores(tmp_path)
    try:
        result = asyncio.run(stores.call("acct", spec.bindings["E"], "ping", [1], {}))
    finally:
        stores.close()
    assert result == ["acct", "t1", "ping", [1]]
    assert kinds.upload_payload(config.bindings)["echo_things"] == [{"binding": "E", "thing": "t1"}]


def test_the_isolate_builds_only_sdk_classes_from_workers():
    for bad in ("os:system", "workers.kv", "workers.kv:KV_TYPES", "runtime.app:Runtime"):
        with pytest.raises(SystemExit):
            sdk_client(bad)
