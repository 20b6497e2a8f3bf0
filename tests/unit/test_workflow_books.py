"""The replay books of workflow instances (runtime.bindings.workflow_books, in a real SQLite file
with a clock the test moves) driven through the SDK's own step object (workers.workflow_step), and
Cloudflare's duration strings (workers.durations)."""

from __future__ import annotations

import asyncio

import pytest

from runtime.bindings.common import BindingError
from runtime.bindings.workflow_books import StepConfig
from runtime.bindings.workflows import LIVE_INSTANCES, WorkflowStore
from runtime.control.config import ConfigError, parse_config
from workers.binding_values import BindingError as SDKBindingError
from workers.binding_values import binding_error
from workers.durations import MAX_MS, duration_ms
from workers.workflow_step import Suspend, WorkflowStep
from workers.workflows import NonRetryableError


class Clock:
    def __init__(self):
        self.now = 1_000_000.0

    def __call__(self):
        return self.now


@pytest.fixture
def store(tmp_path):
    s = WorkflowStore(tmp_path / "workflows.sqlite", clock=Clock())
    yield s
    s.close()


def new(store, ident="i-1", params=None, account="acct", workflow="flow"):
    store.call(account, workflow, "create", [{"id": ident, "params": params}], {})
    assert store.books.begin(account, workflow, ident, generation(store, ident, account, workflow))


def generation(store, ident, account="acct", workflow="flow"):
    return store.books.state(account, workflow, ident)[1]


def stepper(store, ident="i-1", account="acct", workflow="flow"):
    """A fresh run's `step`, its calls answered by the books (as the runtime scopes them)."""
    gen = generation(store, ident, account, workflow)

    async def transport(method, args, kwargs):
        try:
            return store.books.step_call(account, workflow, ident, gen, method, args)
        except BindingError as exc:  # as the isolate's channel raises a refused call
            raise binding_error(exc.type, str(exc)) from None

    return WorkflowStep(transport)


def run(coro):
    return asyncio.run(coro)


# --- durations ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "ms"),
    [(500, 500), (1.5, 2), ("10 seconds", 10_000), ("1 second", 1_000), ("2.5 hours", 9_000_000),
     ("3 minutes", 180_000), ("1 day", 86_400_000), ("2 weeks", 14 * 86_400_000), ("0 seconds", 0),
     ("250 milliseconds", 250), ("1 year", MAX_MS)],
)  # fmt: skip
def test_durations_read_as_cloudflare_writes_them(given, ms):
    assert duration_ms(given) == ms


@pytest.mark.parametrize("given", ["10 sec", "ten seconds", "5", "-1 second", -5, "2 years", float("nan")])
def test_a_duration_that_is_no_duration_says_what_to_write(given):
    with pytest.raises(ValueError, match="duration|out of range"):
        duration_ms(given)


def test_a_duration_of_another_type_is_a_type_error():
    for given in (True, None, [1]):
        with pytest.raises(TypeError, match="milliseconds"):
            duration_ms(given)


def test_step_config_defaults_and_backoffs_are_cloudflares():
    default = StepConfig({})
    assert (default.limit, default.delay_ms, default.backoff, default.timeout_ms) == (
        5,
        10_000,
        "exponential",
        600_000,
    )
    assert [default.delay_after(a) for a in (1, 2, 3)] == [10_000, 20_000, 40_000]
    linear = StepConfig(
        {"retries": {"limit": 2, "delay": "1 second", "backoff": "linear"}, "timeout": "5 seconds"}
    )
    assert [linear.delay_after(a) for a in (1, 2, 3)] == [1_000, 2_000, 3_000] and linear.timeout_ms == 5_000
    assert StepConfig({"retries": {"delay": 7, "backoff": "constant"}}).delay_after(9) == 7
    for bad in (
        {"retries": {"backoff": "random"}},
        {"retries": {"limit": -1}},
        {"timeout": "soon"},
        {"retry": {}},
    ):
        with pytest.raises(BindingError):
            StepConfig(bad)


# --- replay ---------------------------------------------------------------------------------------------


def test_a_finished_step_answers_from_the_books_and_its_body_does_not_run_again(store):
    new(store, params={"n": 3})
    ran = []

    async def workflow(step):
        @step.do("load")
        async def load():
            ran.append("load")
            return {"n": 3}

        @step.do("square", depends=[load])
        async def square(load):  # injected by the dependency's name
            ran.append("square")
            return load["n"] ** 2

        @step.do("twice", depends=[load, square], concurrent=True)
        async def twice(a, b):  # by position
            return [a["n"], b]

        first = await square()
        await step.sleep("nap", "1 minute")
        return first, await twice()

    with pytest.raises(Suspend):  # the first run stops at the sleep
        run(workflow(stepper(store)))
    assert ran == ["load", "square"]
    assert store.status("acct", "flow", "i-1")["status"] == "waiting"
    assert store.books.due("acct", "flow", 10, set()) == []
    store.clock.now += 61
    (due,) = store.books.due("acct", "flow", 10, set())
    assert due[0] == "i-1" and due[1] == {"n": 3}
    assert store.books.begin("acct", "flow", "i-1", due[3])
    assert run(workflow(stepper(store))) == (9, [3, 9])  # replayed: load and square did not run again
    assert ran == ["load", "square"]


def test_a_sleep_keeps_the_wake_time_it_was_first_given(store):
    new(store)
    with pytest.raises(Suspend):
        run(stepper(store).sleep("nap", "10 seconds"))
    store.clock.now += 6
    assert not store.books.begin("acct", "flow", "i-1", 0)  # not due yet
    store.clock.now += 4  # 10 s after the first call, not 10 s after any replay
    assert store.books.begin("acct", "flow", "i-1", 0)
    assert run(stepper(store).sleep("nap", "10 seconds")) is None


def test_repeated_names_are_distinct_steps_in_order(store):
    new(store)
    count = []

    async def loop(step):
        out = []
        for i in range(3):

            @step.do("item")
            async def item(i=i):
                count.append(i)
                return i * 10

            out.append(await item())
        return out

    assert run(loop(stepper(store))) == [0, 10, 20]
    assert run(loop(stepper(store))) == [0, 10, 20] and count == [0, 1, 2]


def test_retries_count_across_runs_then_the_step_fails(store):
    new(store)
    tries = []
    config = {"retries": {"limit": 2, "delay": "5 seconds", "backoff": "constant"}}

    async def workflow(step):
        @step.do("flaky", config=config)
        async def flaky():
            tries.append(1)
            raise ValueError("down")

        return await flaky()

    for _ in range(2):  # each failure waits 5 s, past the inline wait: the run suspends
        with pytest.raises(Suspend):
            run(workflow(stepper(store)))
        assert store.status("acct", "flow", "i-1")["status"] == "waiting"
        store.clock.now += 5
        assert store.books.begin("acct", "flow", "i-1", generation(store, "i-1"))
    with pytest.raises(ValueError, match="down"):
        run(workflow(stepper(store)))
    assert len(tries) == 3  # the first attempt and 2 retries
    with pytest.raises(RuntimeError, match="ValueError: down"):  # replayed: failed for good
        run(workflow(stepper(store)))
    assert len(tries) == 3


def test_a_non_retryable_error_is_not_retried(store):
    new(store)
    tries = []

    async def workflow(step):
        @step.do("no")
        async def no():
            tries.append(1)
            raise NonRetryableError("never")

        return await no()

    with pytest.raises(NonRetryableError):
        run(workflow(stepper(store)))
    assert tries == [1]


def test_a_result_that_is_not_json_or_too_big_is_refused_saying_so(store):
    new(store)

    async def returns(step, value):
        @step.do("bad")
        async def bad():
            return value

        return await bad()

    with pytest.raises(TypeError, match="not JSON-serializable"):
        run(returns(stepper(store), b"bytes"))
    new(store, "i-2")
    with pytest.raises(ValueError, match="the limit is 1024 KiB"):
        run(returns(stepper(store, "i-2"), "x" * (1024 * 1024 + 1)))


def test_wait_for_event_takes_a_buffered_event_and_times_out_otherwise(store):
    new(store)
    store.call("acct", "flow", "send_event", ["i-1", {"type": "go", "payload": {"k": 1}}], {})
    event = run(stepper(store).wait_for_event("w", "go", timeout="1 minute"))
    assert event["payload"] == {"k": 1} and event.type == "go"
    with pytest.raises(Suspend):
        run(stepper(store).wait_for_event("w2", "go", timeout="1 minute"))
    store.clock.now += 61
    assert store.books.begin("acct", "flow", "i-1", 0)  # due: its timeout has come
    with pytest.raises(TimeoutError, match="no 'go' event"):
        run(stepper(store).wait_for_event("w2", "go", timeout="1 minute"))


def test_an_old_runs_calls_after_restart_only_hear_suspend(store):
    new(store)
    old = stepper(store)
    store.call("acct", "flow", "restart", ["i-1"], {})
    with pytest.raises(Suspend):
        run(old.sleep("nap", 0))
    assert store.status("acct", "flow", "i-1")["status"] == "queued"


def test_a_step_that_changes_kind_between_runs_is_refused(store):
    new(store)
    run(stepper(store).sleep("x", 0))

    async def as_do(step):
        @step.do("x")
        async def x():
            return 1

        return await x()

    with pytest.raises(SDKBindingError, match="same order on every run"):
        run(as_do(stepper(store)))


# --- the binding's side ---------------------------------------------------------------------------------


def test_instances_are_per_account_and_ids_are_checked(store):
    new(store, "mine")
    with pytest.raises(BindingError, match="instance.not_found"):
        store.call("other", "flow", "get", ["mine"], {})
    with pytest.raises(BindingError, match="instance.not_found"):
        store.call("acct", "another-flow", "status", ["mine"], {})
    for bad in ("", "a/b", "x" * 101, 7, "../up"):
        with pytest.raises(BindingError, match="instance id"):
            store.call("acct", "flow", "create", [{"id": bad}], {})
    with pytest.raises(BindingError, match="already exists"):
        store.call("acct", "flow", "create", [{"id": "mine"}], {})
    with pytest.raises(BindingError, match="unknown option"):
        store.call("acct", "flow", "create", [{"id": "x", "param": 1}], {})


def test_live_instances_are_bounded_and_finished_ones_do_not_count(store):
    for start in range(0, LIVE_INSTANCES, 100):
        store.call("acct", "flow", "create_batch", [[{"id": f"i{start + i}"} for i in range(100)]], {})
    with pytest.raises(BindingError, match=f"at most {LIVE_INSTANCES} may be"):
        store.call("acct", "flow", "create", [{}], {})
    store.call("other", "flow", "create", [{}], {})  # another account's count is its own
    store.call("acct", "flow", "terminate", ["i0"], {})
    store.call("acct", "flow", "create", [{}], {})
    with pytest.raises(BindingError, match="1 to 100 instances"):
        store.call("acct", "flow", "create_batch", [[{}] * 101], {})


def test_what_an_account_keeps_is_bounded_and_given_back_when_it_goes(tmp_path):
    small = WorkflowStore(tmp_path / "small.sqlite", clock=Clock(), quota_bytes=10_000)
    try:
        small.call("acct", "flow", "create", [{"id": "a", "params": "x" * 6_000}], {})
        with pytest.raises(BindingError, match="over the 9.8 KiB one account may keep here"):
            small.call("acct", "flow", "create", [{"id": "b", "params": "y" * 6_000}], {})
        small.call("other", "flow", "create", [{"id": "b", "params": "y" * 6_000}], {})  # its own quota
        with pytest.raises(BindingError, match="send_event: payload"):
            small.call("acct", "flow", "send_event", ["a", {"type": "t", "payload": "z" * 5_000}], {})
        small.call("acct", "flow", "send_event", ["a", {"type": "t", "payload": "z" * 3_000}], {})
        small.call("acct", "flow", "restart", ["a"], {})  # its event goes, and its bytes with it
        small.call("acct", "flow", "send_event", ["a", {"type": "t", "payload": "z" * 3_000}], {})
    finally:
        small.close()


def test_workflows_read_from_toml_and_jsonc_as_wrangler_writes_them():
    toml = """
name = "w"
main = "worker.py"
compatibility_date = "2025-11-01"

[[workflows]]
name = "signup"
binding = "SIGNUP"
class_name = "Signup"
"""
    jsonc = """{
  // wrangler.jsonc
  "name": "w", "main": "worker.py", "compatibility_date": "2025-11-01",
  "workflows": [{"name": "signup", "binding": "SIGNUP", "class_name": "Signup"}]
}"""
    for text, syntax in ((toml, "toml"), (jsonc, "json")):
        (entry,) = parse_config(text, syntax=syntax).bindings["workflows"]
        assert (entry.name, entry.binding, entry.class_name) == ("signup", "SIGNUP", "Signup")
    with pytest.raises(ConfigError, match="class_name"):
        parse_config(toml.replace('class_name = "Signup"\n', ""), syntax="toml")


def test_a_cut_run_counts_its_step_an_attempt_then_errors_the_instance(store):
    new(store)
    books, config = store.books, StepConfig({"retries": {"limit": 1, "delay": 0}})
    assert (
        books.step_call("acct", "flow", "i-1", 0, "do", ["spin", 1, {"retries": {"limit": 1, "delay": 0}}])[
            "state"
        ]
        == "run"
    )
    assert books.interrupt("acct", "flow", "i-1", 0, ("spin", 1), config, "step 'spin' timed out") == "retry"
    assert store.status("acct", "flow", "i-1")["status"] == "running"  # due again at once
    reply = books.step_call(
        "acct", "flow", "i-1", 0, "do", ["spin", 1, {"retries": {"limit": 1, "delay": 0}}]
    )
    assert reply == {"state": "run", "attempt": 2, "timeout_ms": 600_000}
    assert (
        books.interrupt("acct", "flow", "i-1", 0, ("spin", 1), config, "step 'spin' timed out") == "errored"
    )
    status = store.status("acct", "flow", "i-1")
    assert status["status"] == "errored" and status["error"]["message"] == "step 'spin' timed out"
    assert books.interrupt("acct", "flow", "i-1", 0, None, None, "again") == "gone"  # it is over


def test_the_first_run_sees_a_result_as_every_replay_will(store):
    new(store)

    async def workflow(step):
        @step.do("shape")
        async def shape():
            return {1: (2, 3)}

        return await shape()

    assert run(workflow(stepper(store))) == {"1": [2, 3]}  # through JSON, as the books keep it
    assert run(workflow(stepper(store))) == {"1": [2, 3]}
