"""Open a checkpoint for serving: verify its signed manifest while the files are read."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import msgspec

from engine.load.integrity import MANIFEST, IntegrityError, compare_files, load_public_key, read_manifest
from engine.load.weights import Checkpoint

log = logging.getLogger("edge.integrity")

TRUSTED_KEYS_ENV = "EDGE_TRUSTED_KEYS"
# the shipped models' keys: models/keys in a checkout, runtime/shipped_models/keys in a wheel (setup.py)
_SHIPPED = Path(__file__).resolve().parents[2] / "runtime" / "shipped_models"
DEFAULT_KEYS_DIR = (_SHIPPED if _SHIPPED.is_dir() else _SHIPPED.parents[1] / "models") / "keys"


class VerificationRecord(msgspec.Struct):
    signed: bool
    signed_by: str | None  # key id (SHA-256 of the raw Ed25519 public key)
    seconds: float  # reading, hashing and checking, all files
    source_manifest_sha256: str | None = None


def default_trusted_keys() -> list[Path]:
    env = os.environ.get(TRUSTED_KEYS_ENV)
    if env:
        return [Path(p) for p in env.split(os.pathsep) if p]
    return sorted(DEFAULT_KEYS_DIR.glob("*.pub")) if DEFAULT_KEYS_DIR.is_dir() else []


def load_verified(
    model_dir: Path, trusted_keys: list[str | Path] | None, allow_unsigned: bool
) -> tuple[VerificationRecord, Checkpoint]:
    started = time.perf_counter()
    if not (model_dir / MANIFEST).is_file():
        if not allow_unsigned:
            raise IntegrityError(
                model_dir,
                [
                    f"there is no {MANIFEST}; sign the model with `edge models sign {model_dir} --key KEY`, "
                    "or allow unsigned models ([models] allow_unsigned = true, or allow_unsigned=True)"
                ],
            )
        log.warning("%s is unsigned; loading it because unsigned models are allowed", model_dir)
        checkpoint = Checkpoint(model_dir)
        return VerificationRecord(False, None, time.perf_counter() - started), checkpoint
    keys = [
        load_public_key(Path(k))
        for k in (trusted_keys if trusted_keys is not None else default_trusted_keys())
    ]
    manifest = read_manifest(model_dir, keys)
    if not manifest.ok:
        raise IntegrityError(model_dir, manifest.problems)

    def check(digests: dict[str, str]) -> None:
        problems = compare_files(model_dir, manifest.files, digests)
        if problems:
            raise IntegrityError(model_dir, problems)

    checkpoint = Checkpoint(model_dir, check_digests=check)  # hashes while reading, checks before parsing
    return VerificationRecord(
        True,
        manifest.signed_by,
        time.perf_counter() - started,
        manifest.predicate.get("source_manifest_sha256"),
    ), checkpoint
