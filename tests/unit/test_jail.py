"""The jail around every isolate, probed from inside by a worker script (run as root on CI)."""

import asyncio
import json
import textwrap

import pytest

from runtime.isolate import ipc
from runtime.isolate.host import QuietHost
from runtime.isolate.process import Isolate, IsolateLimits, isolation_problem, use_insecure_isolation

PROBE = """
import ctypes, errno, json, os, platform
from workers import Response

libc = ctypes.CDLL(None, use_errno=True)
NR = {"x86_64": {"clone": 56, "unshare": 272, "bpf": 321, "keyctl": 250},
      "aarch64": {"clone": 220, "unshare": 97, "bpf": 280, "keyctl": 219}}[platform.machine()]


def errno_of(result):
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]


def status(key):
    with open("/proc/self/status") as f:
        return next(line.split(":", 1)[1].strip() for line in f if line.startswith(key + ":"))


def write(path, size):
    try:
        with open(path, "wb") as f:
            f.write(b"x" * size)
        return "ok"
    except OSError as exc:
        return errno.errorcode[exc.errno]


async def on_fetch(request, env):
    out = {
        "uid": os.getuid(), "gid": os.getgid(), "pid": os.getpid(),
        "cap_eff": status("CapEff"), "cap_prm": status("CapPrm"), "cap_bnd": status("CapBnd"),
        "no_new_privs": status("NoNewPrivs"), "seccomp": status("Seccomp"),
        "ptrace": errno_of(libc.ptrace(0, 0, 0, 0)),
        "mount": errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
        "unshare": errno_of(libc.syscall(NR["unshare"], 0x10000000)),
        "clone_newuser": errno_of(libc.syscall(NR["clone"], 0x10000000 | 17, 0, 0, 0, 0)),
        "bpf": errno_of(libc.syscall(NR["bpf"], 0, 0, 0)),
        "keyctl": errno_of(libc.syscall(NR["keyctl"], 0, 0, 0, 0, 0)),
        "interfaces": sorted(line.split(":")[0].strip() for line in open("/proc/net/dev").readlines()[2:]),
        "root": sorted(os.listdir("/")),
        "bundle": sorted(os.listdir(".")),
        "write_bundle": write("written.txt", 10),
        "tmp_small": write("/tmp/small", 1024),
        "tmp_big": write("/tmp/big", 20 * 1024 * 1024),
        "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    }
    return Response(json.dumps(out))
"""


def probe(folder, **limits):
    async def go():
        iso = Isolate(
            "probe", folder / "worker.py", {}, None, QuietHost(ai=_no_ai), limits=IsolateLimits(**limits)
        )
        await iso.start()
        try:
            res = await iso.invoke("GET", "http://x/", [], b"", {})
        finally:
            await iso.stop()
        assert isinstance(res, ipc.InvokeResult), res
        return json.loads(res.body)

    return asyncio.run(go())


async def _no_ai(call):
    return ipc.AIReply(call.call, error_code=5004, error_message="no AI here")


@pytest.fixture(scope="module")
def inside(tmp_path_factory):
    folder = tmp_path_factory.mktemp("jail")
    (folder / "worker.py").write_text(textwrap.dedent(PROBE))
    (folder / "helper.txt").write_text("part of the bundle")
    (folder / ".edge").mkdir()  # as if main pointed at the folder that holds the runtime's state
    (folder / ".edge" / "api-token").write_text("secret")
    (folder / ".dev.vars").write_text("API_KEY=secret")
    return probe(folder)


def test_this_machine_can_jail():
    assert isolation_problem() is None


def test_an_unprivileged_uid_with_no_capabilities(inside):
    assert (inside["uid"], inside["gid"], inside["pid"]) == (1000, 1000, 1)
    zero = "0000000000000000"
    assert (inside["cap_eff"], inside["cap_prm"], inside["cap_bnd"]) == (zero, zero, zero)
    assert inside["no_new_privs"] == "1" and inside["seccomp"] == "2"


def test_seccomp_refuses_what_a_worker_never_needs(inside):
    for call in ("ptrace", "mount", "unshare", "clone_newuser", "bpf", "keyctl"):
        assert inside[call] == "EPERM", call


def test_no_network_and_no_other_processes(inside):
    assert inside["interfaces"] == ["lo"]
    assert inside["processes"] == [1]


def test_a_minimal_read_only_view(inside):
    assert set(inside["root"]) <= {"bin", "bundle", "dev", "edge", "etc", "lib", "lib32", "lib64", "proc"} | {
        "root",
        "tmp",
        "usr",
        "opt",
        "home",
    }
    # the bundle, without the runtime's state or hidden files beside it
    assert inside["bundle"] == ["helper.txt", "worker.py"]
    assert inside["write_bundle"] == "EROFS"


def test_tmp_is_private_and_capped(inside):
    assert inside["tmp_small"] == "ok"
    assert inside["tmp_big"] in ("ENOSPC", "EFBIG")


def test_a_bundle_too_large_for_the_jail_is_refused_with_a_reason(tmp_path):
    (tmp_path / "worker.py").write_text(textwrap.dedent(PROBE))
    for i in range(1001):
        (tmp_path / f"f{i}.txt").write_text("x")
    from runtime.isolate.process import WorkerLoadError

    with pytest.raises(WorkerLoadError, match="give `main` a folder of its own"):
        probe(tmp_path)


def test_insecure_isolation_still_runs_the_worker(tmp_path, caplog):
    (tmp_path / "worker.py").write_text(
        "import json, os\nfrom workers import Response\n"
        "async def on_fetch(request, env):\n    return Response(json.dumps({'pid': os.getpid()}))\n"
    )
    use_insecure_isolation(True)
    try:
        out = probe(tmp_path)
    finally:
        use_insecure_isolation(False)
    assert out["pid"] != 1 and "WITHOUT namespaces" in caplog.text


def test_where_the_kernel_refuses_user_namespaces_the_message_names_the_sysctls():
    import subprocess
    import sys

    from tests.conftest import REPO

    refuse = (
        "import runtime.isolate.jail as jail\n"
        "class Kernel:\n"
        "    def unshare(self, flags):\n"
        "        return -1\n"
        "jail._unshare(Kernel())\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", refuse], capture_output=True, text=True, env={"PYTHONPATH": str(REPO)}
    )
    assert done.returncode == 112  # runtime.isolate.jail.NO_USER_NAMESPACES
    for name in ("user.max_user_namespaces", "kernel.unprivileged_userns_clone", "--insecure-isolation"):
        assert name in done.stderr
