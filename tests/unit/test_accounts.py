"""Accounts in the runtime's SQLite state: settings with their defaults and checks, tokens made,
listed and revoked, and a database made by an older runtime migrated when it is opened."""

import sqlite3

import pytest

from runtime.control.accounts import (
    DEFAULT_RPM,
    AccountError,
    AccountExists,
    Accounts,
    AccountSettings,
    UnknownAccount,
)
from runtime.control.state import State

# The schema of the runtime before accounts had settings (runtime/control/state.py at main, 2026-11).
OLD_SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS tokens (
    hash TEXT PRIMARY KEY, account_id TEXT NOT NULL REFERENCES accounts(id), name TEXT,
    created REAL NOT NULL);
CREATE TABLE IF NOT EXISTS versions (
    id TEXT PRIMARY KEY, account_id TEXT NOT NULL, worker TEXT NOT NULL, created REAL NOT NULL,
    main TEXT NOT NULL, files TEXT NOT NULL, config TEXT NOT NULL, message TEXT);
CREATE TABLE IF NOT EXISTS deployments (
    id TEXT PRIMARY KEY, account_id TEXT NOT NULL, worker TEXT NOT NULL, created REAL NOT NULL,
    strategy TEXT NOT NULL, message TEXT);
CREATE TABLE IF NOT EXISTS secrets (
    account_id TEXT NOT NULL, worker TEXT NOT NULL, name TEXT NOT NULL, value TEXT NOT NULL,
    PRIMARY KEY (account_id, worker, name));
"""


@pytest.fixture
def accounts(tmp_path):
    state = State(tmp_path / ".edge" / "state.db")
    yield Accounts(state)
    state.close()


def test_an_account_is_created_with_the_defaults_and_its_token_works(accounts):
    account, token = accounts.create("acme", AccountSettings())
    assert account.id == "acme" and account.settings == AccountSettings(DEFAULT_RPM, None, 1.0, 1.0)
    assert DEFAULT_RPM == 300
    assert accounts.state.account_for(token) == "acme"
    assert [t["name"] for t in accounts.tokens("acme")] == ["default"]
    assert token not in str(accounts.tokens("acme"))  # only the hash is stored
    shown = accounts.list()[0].to_json()
    assert shown["id"] == "acme" and shown["rpm"] == 300 and shown["tpm"] is None


def test_updates_change_only_what_they_name_and_survive_a_restart(tmp_path):
    state = State(tmp_path / "state.db")
    Accounts(state).create("acme", AccountSettings(rpm=10, tpm=5000))
    Accounts(state).update("acme", {"weight": 2, "kv_share": 0.5})
    state.close()
    reopened = State(tmp_path / "state.db")
    assert Accounts(reopened).settings("acme") == AccountSettings(10, 5000, 2.0, 0.5)
    Accounts(reopened).update("acme", {"tpm": None})  # null: unlimited again
    assert Accounts(reopened).settings("acme").tpm is None


@pytest.mark.parametrize("name", ["", "Acme", "a" * 64, "a b", "a/b", "ünï", "a.b", None])
def test_a_bad_account_name_is_refused_saying_what_to_use(accounts, name):
    with pytest.raises(AccountError, match="1-63 characters of lowercase letters, digits"):
        accounts.create(name, AccountSettings())


@pytest.mark.parametrize(
    "changes, key",
    [
        ({"rpm": 0}, "rpm"),
        ({"rpm": 2.5}, "rpm"),
        ({"rpm": True}, "rpm"),
        ({"rpm": None}, "rpm"),
        ({"tpm": -1}, "tpm"),
        ({"weight": 0}, "weight"),
        ({"weight": float("nan")}, "weight"),
        ({"weight": "heavy"}, "weight"),
        ({"kv_share": 0}, "kv_share"),
        ({"kv_share": 1.01}, "kv_share"),
        ({"kv_share": float("inf")}, "kv_share"),
    ],
)
def test_bad_settings_are_refused_naming_the_key(accounts, changes, key):
    accounts.create("acme", AccountSettings())
    with pytest.raises(AccountError, match=f"^{key}: "):
        accounts.update("acme", changes)
    assert accounts.settings("acme") == AccountSettings()  # nothing changed


def test_unknown_settings_and_accounts_are_refused(accounts):
    accounts.create("acme", AccountSettings())
    with pytest.raises(AccountError, match="unknown setting rmp; the settings are rpm"):
        accounts.update("acme", {"rmp": 3})
    with pytest.raises(UnknownAccount, match="no account 'nobody'; create it with"):
        accounts.update("nobody", {"rpm": 3})
    with pytest.raises(UnknownAccount):
        accounts.create_token("nobody")
    with pytest.raises(AccountExists, match="edge accounts update acme"):
        accounts.create("acme", AccountSettings())
    assert accounts.settings("nobody") == AccountSettings()  # an account never stored: the defaults


def test_tokens_are_made_named_listed_and_revoked_by_name(accounts):
    _, first = accounts.create("acme", AccountSettings())
    name, ci = accounts.create_token("acme", "ci")
    auto, other = accounts.create_token("acme")
    assert name == "ci" and auto == "token-3"
    assert [t["name"] for t in accounts.tokens("acme")] == ["default", "ci", "token-3"]
    with pytest.raises(AccountExists, match="has a token named 'ci'"):
        accounts.create_token("acme", "ci")
    with pytest.raises(AccountError, match="token name"):
        accounts.create_token("acme", "bad\nname")
    assert accounts.revoke_token("acme", "ci") == 1
    assert accounts.state.account_for(ci) is None
    assert accounts.state.account_for(first) == accounts.state.account_for(other) == "acme"
    assert accounts.revoke_token("acme", "ci") == 0
    accounts.create("other", AccountSettings())
    assert accounts.revoke_token("other", "default") == 1  # another account's token of that name stays
    assert accounts.state.account_for(first) == "acme"


def test_a_database_made_by_the_old_schema_is_migrated_on_open(tmp_path):
    db = tmp_path / "state.db"
    old = sqlite3.connect(db)
    old.executescript(OLD_SCHEMA)
    old.execute("INSERT INTO accounts VALUES ('local', 1.0)")
    old.execute("INSERT INTO tokens VALUES ('h', 'local', 'edge dev', 1.0)")
    old.execute("INSERT INTO versions VALUES ('v1', 'local', 'app', 1.0, 'w.py', '{}', '{}', NULL)")
    old.commit()
    old.close()
    state = State(db)
    accounts = Accounts(state)
    assert accounts.list()[0].settings == AccountSettings()  # the old account gets the defaults
    assert accounts.tokens("local") == [{"name": "edge dev", "created": 1.0}]
    assert state.version("local", "app", "v1")["main"] == "w.py"  # the rest is untouched
    accounts.update("local", {"rpm": 5})
    state.close()
    again = State(db)  # a second open migrates nothing twice
    assert Accounts(again).settings("local").rpm == 5
    columns = [r[1] for r in again.query("PRAGMA table_info(accounts)")]
    assert columns == ["id", "created", "rpm", "tpm", "weight", "kv_share"]


def test_put_applies_settings_and_keeps_the_tokens(accounts):
    _, token = accounts.create("acme", AccountSettings(rpm=10))
    accounts.put("acme", AccountSettings(rpm=3))
    accounts.put("fresh", AccountSettings(tpm=100))
    assert accounts.settings("acme").rpm == 3 and accounts.state.account_for(token) == "acme"
    assert accounts.settings("fresh") == AccountSettings(tpm=100) and accounts.tokens("fresh") == []
