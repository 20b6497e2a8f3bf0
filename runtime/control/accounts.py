"""Accounts and their API tokens in the runtime's SQLite state (runtime.control.state): each account's
serving settings and its named tokens (stored hashed, shown once when made).

Settings, per account: `rpm` (requests per minute per model; default 300, Workers AI's limit for
text generation), `tpm` (prompt + completion tokens per minute per model; None = unlimited),
`weight` (its fair share of a PoP, > 0) and `kv_share` (the fraction of a PoP's KV blocks it may
hold, in (0, 1]). runtime.control.rate_limit enforces rpm and tpm; the engine's scheduler reads the rest.

The settings are columns of the `accounts` table (runtime.control.state adds them to a database made by an
older runtime when it is opened; its accounts get the defaults).
"""

from __future__ import annotations

import math
import re
import time
from dataclasses import asdict, dataclass, fields, replace
from typing import TYPE_CHECKING, Any

from runtime.control.rate_limit import DEFAULT_RPM, Limits

if TYPE_CHECKING:  # the config reads the checks here without loading the state's SQLite and crypto
    from runtime.control.state import State

__all__ = [
    "DEFAULT_RPM",
    "Account",
    "AccountError",
    "AccountExists",
    "AccountSettings",
    "Accounts",
    "UnknownAccount",
    "check_name",
    "check_token_name",
]

MAX_PER_MINUTE = 10**9  # a bound that keeps the numbers sane, far above any real use
NAME = re.compile(r"[a-z0-9_-]{1,63}")
TOKEN_NAME = re.compile(r"[A-Za-z0-9 ._-]{1,63}")


class AccountError(ValueError):
    """A name or a setting that cannot be used; the message says what to change."""


class AccountExists(AccountError):
    pass


class UnknownAccount(LookupError):
    pass


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise AccountError(
            f"account name {name!r}: use 1-63 characters of lowercase letters, digits, '_' and '-'"
        )
    return name


def check_token_name(name: str) -> str:
    if not isinstance(name, str) or not TOKEN_NAME.fullmatch(name):
        raise AccountError(
            f"token name {name!r}: use 1-63 characters of letters, digits, spaces, '.', '_' and '-'"
        )
    return name


def _per_minute(value: Any, key: str, unlimited: bool) -> None:
    if value is None and unlimited:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_PER_MINUTE:
        also = "; leave it out for no limit" if unlimited else ""
        raise AccountError(f"{key}: {value!r}; expected a whole number from 1 to {MAX_PER_MINUTE}{also}")


def _fraction(value: Any, key: str, upper: float | None) -> None:
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if not number or not math.isfinite(value) or value <= 0 or (upper is not None and value > upper):
        expected = f"a number above 0 and at most {upper:g}" if upper is not None else "a number above 0"
        raise AccountError(f"{key}: {value!r}; expected {expected}")


@dataclass(frozen=True)
class AccountSettings:
    rpm: int = DEFAULT_RPM
    tpm: int | None = None
    weight: float = 1.0
    kv_share: float = 1.0

    def checked(self, where: str = "") -> AccountSettings:
        """These settings if usable, else AccountError naming `where` + the key."""
        _per_minute(self.rpm, f"{where}rpm", unlimited=False)
        _per_minute(self.tpm, f"{where}tpm", unlimited=True)
        _fraction(self.weight, f"{where}weight", upper=1e6)
        _fraction(self.kv_share, f"{where}kv_share", upper=1.0)
        return replace(self, weight=float(self.weight), kv_share=float(self.kv_share))

    def limits(self) -> Limits:
        """What runtime.control.rate_limit enforces of these settings."""
        return Limits(rpm=self.rpm, tpm=self.tpm)

    def changed(self, changes: dict[str, Any]) -> AccountSettings:
        """These settings with `changes` (a subset of the keys) applied and checked."""
        known = [f.name for f in fields(self)]
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise AccountError(f"unknown setting {', '.join(unknown)}; the settings are {', '.join(known)}")
        return replace(self, **changes).checked()


@dataclass(frozen=True)
class Account:
    id: str
    created: float
    settings: AccountSettings

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "created": self.created, **asdict(self.settings)}


class Accounts:
    """The accounts of one runtime's state, their settings and their tokens."""

    def __init__(self, state: State):
        self.state = state

    def list(self) -> list[Account]:
        rows = self.state.query(
            "SELECT id, created, rpm, tpm, weight, kv_share FROM accounts ORDER BY created, id"
        )
        return [_account(row) for row in rows]

    def get(self, name: str) -> Account | None:
        rows = self.state.query(
            "SELECT id, created, rpm, tpm, weight, kv_share FROM accounts WHERE id = ?", (name,)
        )
        return _account(rows[0]) if rows else None

    def limits_of(self, name: str) -> Limits:
        """The account's requests and tokens per minute per model (AccountSettings.limits)."""
        return self.settings(name).limits()

    def settings(self, name: str) -> AccountSettings:
        """The account's settings (the defaults for an account the database does not hold)."""
        account = self.get(name)
        return account.settings if account else AccountSettings()

    def create(self, name: str, settings: AccountSettings) -> tuple[Account, str]:
        """A new account and its first API token (named "default"; only its hash is stored)."""
        check_name(name)
        settings = settings.checked()
        if self.get(name) is not None:
            raise AccountExists(f"account {name!r} exists; change it with `edge accounts update {name}`")
        self._write(name, settings)
        token = self.state.create_token(name, "default")
        return self._must(name), token

    def update(self, name: str, changes: dict[str, Any]) -> Account:
        current = self._must(name)
        self._write(name, current.settings.changed(changes))
        return self._must(name)

    def put(self, name: str, settings: AccountSettings) -> None:
        """Create or replace the account's settings (its tokens are kept): the config's accounts."""
        check_name(name)
        self._write(name, settings.checked())

    def _write(self, name: str, s: AccountSettings) -> None:
        self.state.query(
            "INSERT INTO accounts (id, created, rpm, tpm, weight, kv_share) VALUES (?, ?, ?, ?, ?, ?) "
            "ON CONFLICT (id) DO UPDATE SET rpm = excluded.rpm, tpm = excluded.tpm, "
            "weight = excluded.weight, kv_share = excluded.kv_share",
            (name, time.time(), s.rpm, s.tpm, s.weight, s.kv_share),
        )

    def _must(self, name: str) -> Account:
        account = self.get(name)
        if account is None:
            raise UnknownAccount(f"no account {name!r}; create it with `edge accounts create {name}`")
        return account

    # --- tokens ---------------------------------------------------------------------------------------

    def tokens(self, name: str) -> list[dict[str, Any]]:
        """The account's tokens by name and creation time (a token itself is never kept)."""
        self._must(name)
        rows = self.state.query(
            "SELECT name, created FROM tokens WHERE account_id = ? ORDER BY created", (name,)
        )
        return [{"name": n, "created": created} for n, created in rows]

    def create_token(self, name: str, token_name: str | None = None) -> tuple[str, str]:
        """(token name, token): a new API token for the account, shown only now."""
        taken = {t["name"] for t in self.tokens(name)}
        if token_name is None:  # token-N, the first N from the count up that is free
            n = len(taken) + 1
            while f"token-{n}" in taken:
                n += 1
            token_name = f"token-{n}"
        check_token_name(token_name)
        if token_name in taken:
            raise AccountExists(
                f"account {name!r} has a token named {token_name!r}; revoke it or choose another --name"
            )
        return token_name, self.state.create_token(name, token_name)

    def revoke_token(self, name: str, token_name: str) -> int:
        """Revoke the account's tokens of that name; how many there were (0: none had it)."""
        self._must(name)
        before = len(self.tokens(name))
        self.state.query("DELETE FROM tokens WHERE account_id = ? AND name = ?", (name, token_name))
        return before - len(self.tokens(name))


def _account(row: tuple) -> Account:
    name, created, rpm, tpm, weight, kv_share = row
    return Account(name, created, AccountSettings(rpm, tpm, weight, kv_share))
