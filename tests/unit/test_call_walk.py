"""The request-walk counter (runtime.isolate.inside.walk, bench/request_walk.py): hops and returns."""

from runtime.isolate.inside.walk import Walk


def _walk(edges):
    w = Walk()
    w.edges = [(a, "f", b, "g") for a, b in edges]
    return w


def test_a_hop_is_a_call_into_another_file_and_a_return_one_into_a_file_already_visited():
    s = _walk(
        [("runtime/a.py", "runtime/b.py"), ("runtime/b.py", "runtime/c.py"), ("runtime/c.py", "runtime/a.py")]
    )
    assert s.summary()["hops"] == 3
    assert s.summary()["returns"] == 1  # c -> a: a was left at the first hop
    assert s.summary()["files"] == ["runtime/a.py", "runtime/b.py", "runtime/c.py"]


def test_the_scope_keeps_only_calls_made_from_its_files():
    s = _walk(
        [
            ("runtime/a.py", "edge_sim/x.py"),
            ("edge_sim/x.py", "engine/y.py"),
            ("runtime/a.py", "runtime/b.py"),
        ]
    )
    assert s.summary(("runtime/",))["hops"] == 2
    assert s.summary()["hops"] == 3


def test_recording_collapses_repeated_calls_and_ignores_calls_within_a_file():
    from runtime.isolate.inside import walk as call_walk

    w = Walk()
    w._ours = lambda name: True  # this test file stands in for the repository's files
    w.start()
    try:
        for _ in range(3):
            call_walk.enabled()  # a call from this file into runtime/isolate/inside/walk.py, three times
    finally:
        w.stop()
    assert len([e for e in w.edges if e[3] == "enabled"]) == 1
