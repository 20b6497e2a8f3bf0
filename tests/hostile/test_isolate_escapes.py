"""A hostile worker against a real `edge dev` (as root on CI): each escape fails with the
documented code, and another account's worker beside it keeps answering."""

import os
import time

import httpx
import pytest

from runtime.isolate import proctree

pytestmark = pytest.mark.slow


def error_code(r: httpx.Response) -> int:
    return r.json()["error"]["code"]


def wait_for_new_isolate(edge, before: str, seconds: float = 30) -> str:
    """The attacker's isolate is killed in the background; the next request gets a fresh one."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        now = edge.born()
        if now != before:
            return now
        time.sleep(0.2)
    raise AssertionError("the isolate was never stopped")


def test_no_socket_but_unix_ones(edge):
    r = edge.attack("GET", "sockets")
    assert r.json() == {k: "OSError" for k in ("packet", "raw", "udp", "tcp6", "netlink")}
    edge.assert_victim_answers()


def test_it_cannot_see_or_signal_the_runtime_or_another_isolate(edge):
    edge.victim()  # the victim's isolate is running
    outside = [p for p in proctree.tree(edge.pid) if p != edge.pid] + [edge.pid, 1]
    r = edge.attack("GET", "signal", params={"pids": "-".join(map(str, outside))})
    out = r.json()
    assert all(out[str(pid)] == "ProcessLookupError" for pid in outside if pid != 1), out
    assert out["visible"] == [1]  # its own PID namespace holds only itself
    edge.assert_victim_answers()
    assert edge.attack("GET", "born").status_code == 200  # and it did not even stop itself


def test_a_fork_bomb_stops_at_the_process_cap(edge):
    made = int(edge.attack("GET", "fork-bomb").text)
    assert 0 < made < 16
    edge.assert_victim_answers()


def test_forked_children_count_against_the_memory_cap(edge):
    r = edge.attack("GET", "fork-memory")
    assert r.status_code == 500 and error_code(r) == 1102 and "memory" in r.text
    edge.assert_victim_answers()


def test_cpu_of_a_forked_child_is_counted_and_the_tree_is_stopped(edge):
    before = edge.born()
    assert edge.attack("GET", "fork-spin").text == "forked"
    wait_for_new_isolate(edge, before)
    edge.assert_victim_answers()


def test_cpu_of_wait_until_work_is_counted(edge):
    before = edge.born()
    assert edge.attack("GET", "wait-until-spin").text == "responded"
    wait_for_new_isolate(edge, before)
    edge.assert_victim_answers()


def test_cpu_of_a_streamed_body_is_counted(edge):
    before = edge.born()
    received = []
    with httpx.stream("GET", f"{edge.url}/stream-spin", timeout=60) as r:
        assert r.status_code == 200
        with pytest.raises(httpx.RemoteProtocolError):  # cut off, not ended as if complete
            for chunk in r.iter_bytes():
                received.append(chunk)
    assert b"".join(received).startswith(b"first chunk")
    wait_for_new_isolate(edge, before)
    edge.assert_victim_answers()


def test_a_crash_is_noticed_even_when_a_child_holds_the_socket(edge):
    r = edge.attack("GET", "fork-then-die", timeout=15)
    assert r.status_code == 500 and error_code(r) == 1101
    assert edge.attack("GET", "born").status_code == 200
    edge.assert_victim_answers()


def test_an_oversized_ipc_frame_ends_the_isolate_not_the_runtime(edge):
    r = edge.attack("GET", "big-frame", timeout=20)
    assert r.status_code == 500 and error_code(r) == 1101
    assert edge.attack("GET", "born").status_code == 200
    edge.assert_victim_answers()


def test_garbage_on_the_synchronous_channel_ends_the_isolate(edge):
    r = edge.attack("GET", "sync-garbage", timeout=20)
    assert r.status_code == 500 and error_code(r) == 1101
    assert edge.attack("GET", "born").status_code == 200
    edge.assert_victim_answers()


def test_the_state_directory_and_other_versions_are_out_of_view(edge):
    state = edge.dir / "attacker" / ".edge"
    victim_files = list((state / "scripts").glob("*/worker.py"))
    assert victim_files  # the victim's deployed version is on disk, beside the attacker's folder
    for path in [state / "state.db", state / "api-token", state / "secrets.key", *victim_files]:
        r = edge.attack("GET", "peek", params={"path": str(path)})
        assert (r.status_code, r.text) == (403, "FileNotFoundError"), path
    edge.assert_victim_answers()


def test_output_floods_are_bounded_and_the_worker_keeps_serving(edge):
    log = edge.server.log
    size_before = log.stat().st_size
    r = edge.attack("GET", "flood")
    assert (r.status_code, r.text) == (200, "flooded")
    assert edge.attack("GET", "born").status_code == 200  # not wedged on a full pipe
    assert log.stat().st_size - size_before < 2 * 1024 * 1024  # of ~15 MB written
    edge.assert_victim_answers()


@pytest.mark.parametrize("megabytes", [50, 99])
def test_large_bodies_are_delivered_in_chunks(edge, megabytes):
    size = megabytes * 1024 * 1024
    r = edge.attack("POST", "body", content=b"b" * size)
    assert (r.status_code, r.text) == (200, str(size))
    edge.assert_victim_answers()


def test_a_body_over_the_limit_is_refused_with_413(edge):
    def chunks():  # no content-length: the limit is found on the way
        for _ in range(101):
            yield b"c" * (1024 * 1024)

    r = edge.attack("POST", "body", content=chunks())
    assert r.status_code == 413 and error_code(r) == 1113
    edge.assert_victim_answers()


def rss(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return int(line.split()[1]) * 1024


def test_a_slow_reader_of_an_endless_stream_holds_no_memory_and_cancels_it(edge):
    cancelled = int(edge.attack("GET", "cancelled").text)
    with httpx.stream("GET", f"{edge.url}/endless", timeout=60) as r:
        stream = r.iter_raw()
        for _ in range(4):
            next(stream)
        before = rss(edge.pid)
        time.sleep(3)  # the client reads nothing; the isolate must wait for it
        grown = rss(edge.pid) - before
    assert grown < 64 * 1024 * 1024, grown
    deadline = time.monotonic() + 30
    while int(edge.attack("GET", "cancelled").text) == cancelled:  # the client left: cancelled
        assert time.monotonic() < deadline, "the endless stream was never cancelled"
        time.sleep(0.2)
    edge.assert_victim_answers()


def test_the_isolate_runs_as_an_unprivileged_uid_outside(edge):
    edge.attack("GET", "born")
    uids = []
    for pid in proctree.tree(edge.pid)[1:]:
        with open(f"/proc/{pid}/status") as f:
            uids.append(int(next(x for x in f if x.startswith("Uid:")).split()[1]))
    if os.getuid() == 0:  # the launcher keeps root's uid; the worker's interpreter has its own
        jailed = [u for u in uids if u != 0]
        assert len(jailed) >= 2  # the attacker's and the victim's isolates at least
    else:  # an ordinary user's isolates keep that user's (unprivileged) uid
        assert set(uids) == {os.getuid()}
