"""`edge accounts` and `edge tokens` against a real `edge dev` (no GPU PoP: nothing here needs a
model), as a user runs them: the admin token from the project's .edge/, the API tokens they print
opening the account's API, and the config's [edge.accounts.NAME] applied at start."""

import os
import subprocess
import sys
import textwrap

import httpx
import pytest

from tests.integration.dev_server import DevServer

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    d = tmp_path_factory.mktemp("accounts")
    (d / "worker.py").write_text(
        "from workers import WorkerEntrypoint, Response\n\n"
        "class Default(WorkerEntrypoint):\n"
        "    async def fetch(self, request):\n"
        '        return Response("ok")\n'
    )
    (d / "wrangler-like.toml").write_text(
        textwrap.dedent("""
        name = "accounts"
        main = "worker.py"
        compatibility_date = "2026-11-01"
        [edge]
        pops = []
        [edge.accounts.configured]
        rpm = 7
        weight = 3
    """)
    )
    env = os.environ.pop("EDGE_ADMIN_TOKEN", None)  # the CLI must find edge dev's own
    try:
        with DevServer(d / "wrangler-like.toml", cwd=d) as srv:
            srv.dir = d
            yield srv
    finally:
        if env is not None:
            os.environ["EDGE_ADMIN_TOKEN"] = env


def edge(project, *args):
    return subprocess.run(
        [sys.executable, "-m", "runtime.cli", *args, "--url", project.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=project.dir,  # the config (and its .edge/admin-token) found as edge dev found them
    )


def api_status(project, account, token):
    url = f"{project.url}/client/v4/accounts/{account}/ai/v1/models"
    return httpx.get(url, headers={"authorization": f"Bearer {token}"}, timeout=10).status_code


def test_create_prints_a_token_once_that_opens_the_account(project):
    made = edge(project, "accounts", "create", "acme", "--rpm", "3", "--tpm", "5000")
    assert made.returncode == 0, made.stderr
    token = made.stdout.strip()
    assert token.startswith("edge_") and len(made.stdout.splitlines()) == 1
    assert "created account acme: rpm 3, tpm 5000, weight 1, kv_share 1" in made.stderr
    assert api_status(project, "acme", token) == 200
    listed = edge(project, "accounts", "list")
    assert listed.returncode == 0 and token not in listed.stdout
    rows = {line.split()[0]: line.split() for line in listed.stdout.splitlines()[1:]}
    assert rows["acme"][:5] == ["acme", "3", "5000", "1", "1"] and rows["acme"][5] == "default"
    assert rows["configured"][:4] == ["configured", "7", "unlimited", "3"]  # from the config
    assert "local" in rows  # edge dev's own account


def test_update_changes_what_it_names(project):
    assert edge(project, "accounts", "create", "beta").returncode == 0
    updated = edge(project, "accounts", "update", "beta", "--tpm", "100", "--kv-share", "0.5")
    assert updated.returncode == 0, updated.stderr
    assert updated.stdout.strip() == "updated account beta: rpm 300, tpm 100, weight 1, kv_share 0.5"
    back = edge(project, "accounts", "update", "beta", "--tpm", "unlimited")
    assert "tpm unlimited" in back.stdout


def test_tokens_are_created_listed_and_revoked(project):
    assert edge(project, "accounts", "create", "gamma").returncode == 0
    made = edge(project, "tokens", "create", "gamma", "--name", "ci")
    assert made.returncode == 0 and "created token 'ci' for account gamma" in made.stderr
    token = made.stdout.strip()
    assert api_status(project, "gamma", token) == 200
    listed = edge(project, "tokens", "list", "gamma")
    assert [line.split()[0] for line in listed.stdout.splitlines()] == ["default", "ci"]
    revoked = edge(project, "tokens", "revoke", "gamma", "ci")
    assert revoked.returncode == 0 and "revoked token 'ci' of account gamma" in revoked.stdout
    assert api_status(project, "gamma", token) == 401


@pytest.mark.parametrize(
    "args, message",
    [
        (("accounts", "create", "Bad"), "1-63 characters of lowercase letters"),
        (("accounts", "create", "delta", "--kv-share", "2"), "kv_share: 2.0; expected a number above 0"),
        (("accounts", "update", "nobody", "--rpm", "3"), "no account 'nobody'; create it with"),
        (("accounts", "update", "configured"), "needs at least one of --rpm"),
        (("tokens", "revoke", "configured", "nope"), "no token named 'nope'"),
    ],
)
def test_bad_input_fails_saying_what_to_change(project, args, message):
    out = edge(project, *args)
    assert out.returncode == 2 and message in out.stderr, out.stderr


def test_without_the_admin_token_nothing_is_done(project, tmp_path):
    (tmp_path / "worker.py").write_text("")
    (tmp_path / "wrangler-like.toml").write_text(
        'name = "x"\nmain = "worker.py"\ncompatibility_date = "2026-11-01"\n'
    )
    out = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "accounts", "list", "--url", project.url],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,  # another project: no .edge/admin-token here
        env={k: v for k, v in os.environ.items() if k != "EDGE_ADMIN_TOKEN"},
    )
    assert out.returncode == 2 and "no admin token" in out.stderr
