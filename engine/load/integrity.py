"""Signed model manifests: what files a checkpoint is made of, proven before it is served.

Format (after OpenSSF model signing): an in-toto Statement v1 whose subjects are the checkpoint's
files (relative path and SHA-256), whose predicate records each file's size, the compression
settings and, for a compressed model, the digest of the manifest of the checkpoint it was made
from; wrapped in a DSSE envelope signed with Ed25519. It lives beside the files as manifest.json.

    {"payloadType": "application/vnd.in-toto+json",
     "payload": base64(statement, canonical JSON: sorted keys, no spaces),
     "signatures": [{"keyid": sha256(raw public key) hex, "sig": base64(Ed25519(PAE(type, payload)))}]}

PAE is DSSE's pre-authentication encoding: "DSSEv1 <len(type)> <type> <len(body)> <body>".
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from engine.errors import ModelLoadError
from engine.load.safetensors_io import read_hashed

log = logging.getLogger("edge.integrity")

MANIFEST = "manifest.json"
PAYLOAD_TYPE = "application/vnd.in-toto+json"
STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE = "https://edge-workers.dev/model-manifest/v1"


class IntegrityError(ModelLoadError):
    """A model failed verification; `problems` names each cause."""

    def __init__(self, model_dir: Path, problems: list[str]):
        super().__init__(f"{model_dir}: verification failed: " + "; ".join(problems))
        self.problems = problems


# --- keys -----------------------------------------------------------------------------------------


def keygen(keyfile: Path) -> Path:
    """Write an Ed25519 private key to KEYFILE (PEM, mode 600) and its public key to KEYFILE.pub."""
    key = Ed25519PrivateKey.generate()
    keyfile.parent.mkdir(parents=True, exist_ok=True)
    keyfile.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    keyfile.chmod(0o600)
    pub = keyfile.with_name(keyfile.name + ".pub")
    pub.write_bytes(
        key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    return pub


def load_private_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a readable PEM private key ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise ModelLoadError(f"{path}: not an Ed25519 key")
    return key


def load_public_key(path: Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"{path}: not a readable PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise ModelLoadError(f"{path}: not an Ed25519 public key")
    return key


def key_id(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()


# --- manifests --------------------------------------------------------------------------------------


def _canonical(obj) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def _pae(payload_type: str, body: bytes) -> bytes:
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(body), body)


def model_files(model_dir: Path) -> list[Path]:
    """Every file of the checkpoint (recursively), the manifest itself excepted, sorted."""
    return sorted(p for p in model_dir.rglob("*") if p.is_file() and p.name != MANIFEST)


def file_digest(path: Path) -> str:
    return read_hashed(path)[1]


def manifest_digest(model_dir: Path) -> str | None:
    path = model_dir / MANIFEST
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def sign(model_dir: Path, keyfile: Path, source: Path | None = None) -> Path:
    """Write manifest.json for model_dir, signed with the Ed25519 key in `keyfile`."""
    key = load_private_key(keyfile)
    files = []
    for path in model_files(model_dir):
        files.append(
            {
                "path": path.relative_to(model_dir).as_posix(),
                "size": path.stat().st_size,
                "sha256": file_digest(path),
            }
        )
    config = (
        json.loads((model_dir / "config.json").read_text()) if (model_dir / "config.json").is_file() else {}
    )
    source_digest = None
    quant = config.get("quantization_config")
    if source is not None:
        source_digest = manifest_digest(source)
        if source_digest is None:
            raise ModelLoadError(f"{source}: the source checkpoint has no {MANIFEST}; sign it first")
    elif quant and isinstance(quant.get("source_manifest_sha256"), str):
        source_digest = quant["source_manifest_sha256"]
    statement = {
        "_type": STATEMENT_TYPE,
        "subject": [{"name": f["path"], "digest": {"sha256": f["sha256"]}} for f in files],
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "files": files,
            "model_type": config.get("model_type"),
            "compression": quant or {"weights": "as trained (bf16)"},
            "source_manifest_sha256": source_digest,
        },
    }
    payload = _canonical(statement)
    envelope = {
        "payloadType": PAYLOAD_TYPE,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [
            {
                "keyid": key_id(key.public_key()),
                "sig": base64.b64encode(key.sign(_pae(PAYLOAD_TYPE, payload))).decode(),
            }
        ],
    }
    out = model_dir / MANIFEST
    out.write_text(json.dumps(envelope, indent=2) + "\n")
    return out


@dataclass
class Verification:
    """What a manifest says and whether the files and signature agree with it."""

    signed_by: str | None = None  # key id of the trusted key that signed it
    files: dict[str, dict] = field(default_factory=dict)  # path -> {"size", "sha256"}
    predicate: dict = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


def read_manifest(model_dir: Path, trusted: list[Ed25519PublicKey]) -> Verification:
    """Check the envelope's signature against the trusted keys and parse the statement
    (file digests are compared separately, so they can be hashed while the files are loaded)."""
    result = Verification()
    path = model_dir / MANIFEST
    try:
        envelope = json.loads(path.read_text())
        payload = base64.b64decode(envelope["payload"], validate=True)
        signatures = envelope["signatures"]
        if envelope.get("payloadType") != PAYLOAD_TYPE:
            raise ValueError(f"payloadType is {envelope.get('payloadType')!r}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        result.problems.append(f"{MANIFEST} is unreadable ({exc})")
        return result
    by_id = {key_id(k): k for k in trusted}
    for sig in signatures if isinstance(signatures, list) else []:
        key = by_id.get(sig.get("keyid")) if isinstance(sig, dict) else None
        if key is None:
            continue
        try:
            key.verify(base64.b64decode(sig.get("sig", "")), _pae(PAYLOAD_TYPE, payload))
            result.signed_by = sig["keyid"]
            break
        except (InvalidSignature, ValueError):
            result.problems.append(
                f"the signature by key {sig['keyid'][:16]} does not match the manifest "
                "(edited after signing?)"
            )
            return result
    if result.signed_by is None:
        ids = (
            [s.get("keyid", "?")[:16] for s in signatures if isinstance(s, dict)]
            if isinstance(signatures, list)
            else []
        )
        result.problems.append(
            f"{MANIFEST} is not signed by a trusted key (signed by {', '.join(ids) or 'nobody'})"
        )
        return result
    try:
        statement = json.loads(payload)
        result.predicate = statement["predicate"]
        result.files = {
            f["path"]: {"size": f["size"], "sha256": f["sha256"]} for f in result.predicate["files"]
        }
    except (ValueError, KeyError, TypeError) as exc:
        result.problems.append(f"the signed statement is malformed ({exc})")
    return result


def compare_files(model_dir: Path, expected: dict[str, dict], digests: dict[str, str]) -> list[str]:
    """Problems between the manifest's files and the directory; `digests` holds hashes already
    computed while loading (the rest are hashed here)."""
    problems = []
    present = {p.relative_to(model_dir).as_posix(): p for p in model_files(model_dir)}

    def digest_of(rel: str) -> str:
        if rel not in digests:
            digests[rel] = file_digest(present[rel])
        return digests[rel]

    def swapped_with(rel: str, size: int) -> str | None:
        """The manifest entry whose content this file holds, if it is another one's."""
        for other, want in expected.items():
            if other != rel and want["size"] == size and digest_of(rel) == want["sha256"]:
                return other
        return None

    for rel, want in expected.items():
        path = present.get(rel)
        if path is None:
            problems.append(f"{rel} is missing")
            continue
        size = path.stat().st_size
        if size == want["size"] and digest_of(rel) == want["sha256"]:
            continue
        other = swapped_with(rel, size)
        if other:
            problems.append(f"{rel} holds the content the manifest gives for {other} (files swapped?)")
        elif size != want["size"]:
            problems.append(
                f"{rel} has {size} bytes; the manifest says {want['size']} (truncated or replaced)"
            )
        else:
            problems.append(f"{rel} does not match its SHA-256 in the manifest (modified)")
    for rel in present:
        if rel not in expected:
            problems.append(f"{rel} is not in the manifest (extra file)")
    return problems


def verify(
    model_dir: Path, trusted: list[Ed25519PublicKey], digests: dict[str, str] | None = None
) -> Verification:
    result = read_manifest(model_dir, trusted)
    if result.files:
        result.problems += compare_files(model_dir, result.files, digests or {})
    return result
