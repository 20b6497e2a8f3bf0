"""Secrets at rest: the database holds only ciphertext bound to its worker, under a key file only
the runtime's user can read; older plaintext rows are encrypted when the database is opened."""

import sqlite3
import stat

import pytest

from runtime.control.state import SecretError, State, materialise_bundle

SECRET = "s3cret-value-for-the-test"


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _on_disk(folder) -> bytes:
    return b"".join(p.read_bytes() for p in folder.iterdir() if p.is_file())


def test_the_database_holds_no_plaintext_and_the_worker_gets_the_value(tmp_path):
    state = State(tmp_path / ".edge" / "state.db")
    state.put_secret("acct", "app", "API_KEY", SECRET)
    assert state.secrets("acct", "app") == {"API_KEY": SECRET}
    assert state.secret_names("acct", "app") == ["API_KEY"]
    assert SECRET.encode() not in _on_disk(tmp_path / ".edge")  # database, WAL and shm
    state.close()
    assert SECRET.encode() not in _on_disk(tmp_path / ".edge")
    reopened = State(tmp_path / ".edge" / "state.db")  # the same key decrypts after a restart
    assert reopened.secrets("acct", "app") == {"API_KEY": SECRET}


def test_files_are_private_and_the_state_dir_only_traversable(tmp_path):
    state = State(tmp_path / ".edge" / "state.db")
    state.put_secret("acct", "app", "K", "v")
    edge = tmp_path / ".edge"
    assert _mode(edge / "secrets.key") == 0o600 and len((edge / "secrets.key").read_bytes()) == 32
    assert _mode(edge / "state.db") == 0o600
    for extra in ("state.db-wal", "state.db-shm"):
        if (edge / extra).exists():
            assert _mode(edge / extra) == 0o600
    assert _mode(edge) == 0o700
    # bundles are world-readable files in private folders: the jail copies them as the runtime
    folder = materialise_bundle(edge, "v1", {"w.py": "x = 1\n", "lib/util.py": ""})
    assert _mode(folder) == 0o755 and _mode(folder / "lib") == 0o755
    assert _mode(folder / "w.py") == 0o644 and _mode(folder / "lib" / "util.py") == 0o644
    assert _mode(edge / "scripts") == 0o700 and list((edge / "staging").iterdir()) == []


def test_a_ciphertext_moved_to_another_worker_or_name_does_not_decrypt(tmp_path):
    state = State(tmp_path / "state.db")
    state.put_secret("acct", "app", "API_KEY", SECRET)
    state._q("INSERT INTO secrets SELECT account_id, 'other', name, value FROM secrets")
    state._q("INSERT INTO secrets SELECT 'acct2', worker, name, value FROM secrets WHERE worker = 'app'")
    state._q(
        "INSERT INTO secrets SELECT account_id, worker, 'RENAMED', value FROM secrets WHERE worker = 'app'"
    )
    with pytest.raises(SecretError, match="worker 'other'"):
        state.secrets("acct", "other")
    with pytest.raises(SecretError, match="account 'acct2'"):
        state.secrets("acct2", "app")
    with pytest.raises(SecretError, match="'RENAMED'"):
        state.secrets("acct", "app")


def test_plaintext_rows_of_an_older_database_are_encrypted_on_open(tmp_path):
    db = tmp_path / "state.db"
    old = sqlite3.connect(db)
    old.execute(
        "CREATE TABLE secrets (account_id TEXT NOT NULL, worker TEXT NOT NULL, name TEXT NOT NULL, "
        "value TEXT NOT NULL, PRIMARY KEY (account_id, worker, name))"
    )
    old.execute("INSERT INTO secrets VALUES ('acct', 'app', 'OLD', ?)", (SECRET,))
    old.commit()
    old.close()
    assert SECRET.encode() in db.read_bytes()
    state = State(db)
    assert state.secrets("acct", "app") == {"OLD": SECRET}
    assert state._q("SELECT typeof(value) FROM secrets") == [("blob",)]
    state.close()
    assert SECRET.encode() not in _on_disk(tmp_path)


def test_a_lost_key_is_an_error_not_a_new_key(tmp_path):
    state = State(tmp_path / "state.db")
    state.put_secret("acct", "app", "K", SECRET)
    state.close()
    (tmp_path / "secrets.key").unlink()
    with pytest.raises(SecretError, match="secrets.key is missing"):
        State(tmp_path / "state.db").secrets("acct", "app")
    assert not (tmp_path / "secrets.key").exists()
