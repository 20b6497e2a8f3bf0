"""Signed manifests and verified loading: every tampering is refused with a message naming the
cause, while a good model keeps loading and serving."""

import asyncio
import base64
import json
import shutil
import struct

import pytest

from edge_sim.pop import ModelSpec, PopNode
from edge_sim.request import GenerateRequest
from edge_sim.topology import Topology
from engine import LLM, SamplingParams
from engine.load.checkpoint import quantize_checkpoint
from engine.load.integrity import MANIFEST, IntegrityError, keygen, manifest_digest, sign
from engine.load.safetensors_io import CheckpointIntegrityError, SafetensorsFile
from runtime.cli import main as edge
from tests.conftest import SHIPPED_VOCAB
from tests.hf_reference import tiny_deepseek_v3


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    trusted = d / "trusted.key"
    keygen(trusted)
    other = d / "other.key"
    keygen(other)
    return {
        "trusted": trusted,
        "pub": d / "trusted.key.pub",
        "other": other,
        "other_pub": d / "other.key.pub",
    }


@pytest.fixture(scope="module")
def signed_source(tmp_path_factory, tiny_model_dir, keys):
    """A sharded tiny model with its tokenizer, signed by the trusted key."""
    d = tmp_path_factory.mktemp("signed") / "model"
    tiny_deepseek_v3(d, seed=5, vocab_size=SHIPPED_VOCAB, eos_token_id=5)
    ref = tiny_deepseek_v3(tmp_path_factory.mktemp("x"), seed=5, vocab_size=SHIPPED_VOCAB, eos_token_id=5)
    shutil.rmtree(d)
    ref.save_pretrained(d, max_shard_size="300KB")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(tiny_model_dir / name, d / name)
    sign(d, keys["trusted"])
    return d


@pytest.fixture
def signed(signed_source, tmp_path):
    return shutil.copytree(signed_source, tmp_path / "model")


def shards(d):
    return sorted(d.glob("model-*.safetensors"))


def load(d, keys, **kw):
    return LLM(d, device="cpu", trusted_keys=[keys["pub"]], **kw)


def test_a_signed_model_verifies_and_loads(signed, keys, capsys):
    assert len(shards(signed)) > 1
    llm = load(signed, keys)
    assert llm.verification.signed and llm.verification.seconds > 0
    assert edge(["models", "verify", str(signed), "--pubkey", str(keys["pub"])]) == 0
    assert "files match" in capsys.readouterr().out
    envelope = json.loads((signed / MANIFEST).read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    names = {s["name"] for s in statement["subject"]}
    assert {"config.json", "tokenizer.json", "model.safetensors.index.json"} <= names
    assert all(len(s["digest"]["sha256"]) == 64 for s in statement["subject"])


def expect_refusal(d, keys, fragment, capsys):
    with pytest.raises(IntegrityError) as err:
        load(d, keys)
    assert fragment in str(err.value)
    assert edge(["models", "verify", str(d), "--pubkey", str(keys["pub"])]) == 1
    assert fragment in capsys.readouterr().err


def test_one_flipped_byte_in_a_shard(signed, keys, capsys):
    shard = shards(signed)[1]
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0x01
    shard.write_bytes(data)
    expect_refusal(signed, keys, f"{shard.name} does not match its SHA-256", capsys)


def test_a_truncated_file(signed, keys, capsys):
    shard = shards(signed)[0]
    shard.write_bytes(shard.read_bytes()[:-100])
    expect_refusal(signed, keys, f"{shard.name} has", capsys)


def test_an_extra_file(signed, keys, capsys):
    (signed / "payload.py").write_text("import os\n")
    expect_refusal(signed, keys, "payload.py is not in the manifest (extra file)", capsys)


def test_two_shards_swapped(signed, keys, capsys):
    a, b = shards(signed)[:2]
    tmp = a.with_suffix(".tmp")
    a.rename(tmp)
    b.rename(a)
    tmp.rename(b)
    expect_refusal(
        signed, keys, f"{a.name} holds the content the manifest gives for {b.name} (files swapped?)", capsys
    )


def test_untrusted_signer(signed, keys, capsys):
    sign(signed, keys["other"])
    expect_refusal(signed, keys, "not signed by a trusted key", capsys)


def test_manifest_edited_after_signing(signed, keys, capsys):
    path = signed / MANIFEST
    envelope = json.loads(path.read_text())
    statement = json.loads(base64.b64decode(envelope["payload"]))
    statement["predicate"]["files"][0]["size"] += 1
    envelope["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    path.write_text(json.dumps(envelope))
    expect_refusal(signed, keys, "edited after signing", capsys)


def test_unsigned_models_need_permission(tiny_model_dir):
    with pytest.raises(IntegrityError, match="edge models sign"):
        LLM(tiny_model_dir, device="cpu")
    assert LLM(tiny_model_dir, device="cpu", allow_unsigned=True).verification.signed is False


def safetensors_bytes(header: dict, data: bytes, declared: int | None = None) -> bytes:
    raw = json.dumps(header).encode()
    return struct.pack("<Q", declared if declared is not None else len(raw)) + raw + data


def test_header_with_overlapping_offsets():
    header = {
        "a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]},
    }
    with pytest.raises(CheckpointIntegrityError, match="overlap"):
        SafetensorsFile(safetensors_bytes(header, bytes(12)), "evil.safetensors")


def test_header_declaring_a_huge_length():
    with pytest.raises(CheckpointIntegrityError, match="declares a 1099511627776-byte header"):
        SafetensorsFile(safetensors_bytes({}, b"", declared=1 << 40), "evil.safetensors")


@pytest.mark.parametrize(
    "header, data, fragment",
    [
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}},
            bytes(12),
            "4 bytes after the last tensor",
        ),
        ({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}}, bytes(8), "do not hold a F32 tensor"),
        (
            {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}},
            bytes(8),
            "outside the 8-byte data section",
        ),
        ({"a": {"dtype": "PICKLE", "shape": [1], "data_offsets": [0, 1]}}, bytes(1), "unknown dtype"),
    ],
)
def test_other_malformed_headers(header, data, fragment):
    with pytest.raises(CheckpointIntegrityError, match=fragment):
        SafetensorsFile(safetensors_bytes(header, data), "evil.safetensors")


def test_a_pop_refuses_a_bad_version_and_keeps_serving(signed, keys, tmp_path):
    good = ModelSpec("m", str(signed), trusted_keys=[str(keys["pub"])])
    broken_dir = shutil.copytree(signed, tmp_path / "broken")
    (broken_dir / "extra.bin").write_bytes(b"\x00")
    bad = ModelSpec("m", str(broken_dir), trusted_keys=[str(keys["pub"])])
    other = ModelSpec("other", str(broken_dir), trusted_keys=[str(keys["pub"])])
    node = PopNode.load(Topology.default().pop("ICN"), [good, other])
    try:
        assert "other" in node.refused and "m" in node.engines  # the good one serves, the bad one is named
        assert "extra.bin is not in the manifest" in node.refused["other"]
        reason = node.reload(bad)
        assert reason and "extra.bin" in reason
        assert "extra.bin" in node.status().refused["m"]
        req = GenerateRequest(
            model="m", prompt="def f():", params=SamplingParams(max_tokens=3, temperature=0)
        )
        assert asyncio.run(node.generate(req)).completion_tokens == 3  # still the previous version
        assert node.reload(good) is None and "m" not in node.refused
    finally:
        node.close()


def test_compressed_models_point_to_their_source(signed, keys, tmp_path):
    dst = tmp_path / "int8"
    quantize_checkpoint(signed, dst, "int8")
    sign(dst, keys["trusted"])
    envelope = json.loads((dst / MANIFEST).read_text())
    predicate = json.loads(base64.b64decode(envelope["payload"]))["predicate"]
    assert predicate["source_manifest_sha256"] == manifest_digest(signed)
    assert predicate["compression"]["format"] == "int8"
    assert load(dst, keys).verification.source_manifest_sha256 == manifest_digest(signed)


def test_promotion_gate(signed, keys, tmp_path, capsys):
    text = tmp_path / "heldout.txt"
    text.write_text("def f(x):\n    return x\n" * 300)
    for fmt in ("int8", "int4"):
        quantize_checkpoint(signed, tmp_path / fmt, fmt)
        sign(tmp_path / fmt, keys["trusted"])
    base = [
        "--baseline",
        str(signed),
        "--pubkey",
        str(keys["pub"]),
        "--text",
        str(text),
        "--contexts",
        "64",
        "--record",
        str(tmp_path / "log.jsonl"),
    ]
    assert edge(["models", "promote", str(tmp_path / "int8"), "--max-ppl-increase", "50%", *base]) == 0
    assert "PROMOTED" in capsys.readouterr().out
    assert (
        edge(
            [
                "models",
                "promote",
                str(tmp_path / "int4"),
                "--max-ppl-increase",
                "0.0001%",
                "--min-agreement",
                "1.0",
                *base,
            ]
        )
        == 1
    )
    assert "REFUSED" in capsys.readouterr().err
    (tmp_path / "int8" / "note.txt").write_text("tampered")
    assert edge(["models", "promote", str(tmp_path / "int8"), *base]) == 1
    assert "note.txt is not in the manifest" in capsys.readouterr().err
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["promoted"] for r in records] == [True, False]
    assert all(r["verification_seconds"] > 0 and r["evaluation_seconds"] > 0 for r in records)
