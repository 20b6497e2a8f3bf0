"""Content hashes of full KV blocks for the prefix cache, salted per tenant.

Block i of a sequence is named h_i = SHA-256(h_{i-1} || its 16 token ids), with h_{-1} the tenant's
salt, so a hash names a whole prefix (the chain), not one block's tokens alone. The salt is an HMAC
of the tenant under a key the engine draws at start: it comes from the authenticated account, never
from the client, and cannot be predicted from outside, so two tenants' chains never meet and no
tenant can hit (or time) another's blocks (vLLM's `cache_salt`, after CVE-2025-46570). SHA-256 is
collision resistant, where Python's hash() is not.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
from collections.abc import Sequence

from kernels.formats import KV_BLOCK

_BLOCK_IDS = struct.Struct(f"<{KV_BLOCK}q")


def new_salt_key() -> bytes:
    """The engine's secret for deriving salts: random per process, so salts do not survive it."""
    return secrets.token_bytes(32)


def tenant_salt(key: bytes, tenant: str) -> bytes:
    """The salt of `tenant`'s chains: HMAC-SHA-256 of its name under the engine's key."""
    return hmac.new(key, tenant.encode(), hashlib.sha256).digest()


def extend_hashes(hashes: list[bytes], tokens: Sequence[int], salt: bytes) -> None:
    """Append to `hashes` the chained hash of every full block of `tokens` it does not cover yet."""
    full = len(tokens) // KV_BLOCK
    parent = hashes[-1] if hashes else salt
    for i in range(len(hashes), full):
        parent = hashlib.sha256(parent + _BLOCK_IDS.pack(*tokens[i * KV_BLOCK : (i + 1) * KV_BLOCK])).digest()
        hashes.append(parent)
