"""Queues: the store (send, limits, ordering, delays, attempts, dead letters), the batch and
message objects a consumer's handler gets, and one delivery through a real isolate."""

import asyncio
import re
import stat
import textwrap

import pytest

from runtime.bindings import BindingError, BindingRef, BindingStores, binding_refs
from runtime.bindings.queues import BATCH_BYTES, MESSAGE_BYTES, QueueStore
from runtime.control.config import QueueConsumerConfig
from runtime.events.queue_consumers import ConsumerError, ConsumerSettings
from runtime.isolate import ipc
from runtime.isolate.process import Isolate, IsolateLimits
from workers.queues import MessageBatch


class Clock:
    def __init__(self, now: float = 1_000_000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    s = QueueStore(tmp_path / "q" / "queues.sqlite", clock=clock)
    yield s
    s.close()


def send(store, body, account="a", queue="jobs", **opts):
    store.call(account, queue, "send", [body], opts)


def test_send_keeps_each_body_as_its_content_type_says_in_send_order(store):
    send(store, {"n": 1})
    send(store, "plain", contentType="text")
    send(store, b"\x00raw", contentType="bytes")
    send(store, [1, 2], contentType="json")
    store.call("a", "jobs", "sendBatch", [[{"body": "b1"}, {"body": {"k": "v"}, "contentType": "json"}]], {})
    batch = store.claim("a", "jobs", 10)
    assert [m.body for m in batch] == [{"n": 1}, "plain", b"\x00raw", [1, 2], "b1", {"k": "v"}]
    assert all(m.attempts == 1 for m in batch) and len({m.id for m in batch}) == 6


def test_queues_are_separate_per_account_and_name_and_the_file_is_private(tmp_path, store):
    send(store, 1, account="a", queue="jobs")
    send(store, 2, account="b", queue="jobs")
    send(store, 3, account="a", queue="other")
    assert [m.body for m in store.claim("b", "jobs", 10)] == [2]
    assert [m.body for m in store.claim("a", "jobs", 10)] == [1]
    assert stat.S_IMODE((tmp_path / "q" / "queues.sqlite").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "q").stat().st_mode) == 0o700


@pytest.mark.parametrize(
    ("method", "args", "opts", "error", "fragment"),
    [
        ("send", ["x" * (MESSAGE_BYTES + 1)], {"contentType": "text"}, "RangeError", "the limit is 128000"),
        ("send", ["x"], {"contentType": "bytes"}, "TypeError", "needs a bytes body"),
        ("send", [b"x"], {"contentType": "json"}, "TypeError", "JSON-serialisable"),
        ("send", ["x"], {"contentType": "xml"}, "TypeError", "contentType must be one of"),
        ("send", ["x"], {"delaySeconds": 43_201}, "RangeError", "delaySeconds"),
        ("send", ["x"], {"priority": 1}, "TypeError", "unknown option(s) priority"),
        (
            "sendBatch",
            [[{"body": i} for i in range(101)]],
            {},
            "RangeError",
            "101 messages; the limit is 100",
        ),
        ("sendBatch", [[{"body": "x" * 100_000}] * 3], {}, "RangeError", f"the limit is {BATCH_BYTES}"),
        ("sendBatch", [[]], {}, "TypeError", "non-empty list"),
        ("sendBatch", [["not a dict"]], {}, "TypeError", "message 0 must be a dict"),
        ("purge", [], {}, "TypeError", "no method 'purge'"),
    ],
)
def test_limits_and_bad_arguments_are_refused_and_nothing_is_stored(
    store, method, args, opts, error, fragment
):
    with pytest.raises(BindingError, match=re.escape(fragment)) as info:
        store.call("a", "jobs", method, args, opts)
    assert info.value.type == error
    assert store.ready("a", "jobs") == 0


def test_a_batch_with_one_bad_message_stores_none(store):
    with pytest.raises(BindingError):
        store.call("a", "jobs", "sendBatch", [[{"body": 1}, {"body": "x", "contentType": "bytes"}]], {})
    assert store.ready("a", "jobs") == 0


def test_delays_hide_a_message_until_they_pass_and_claimed_messages_are_leased(store, clock):
    send(store, "later", delaySeconds=30)
    send(store, "now")
    assert [m.body for m in store.claim("a", "jobs", 10)] == ["now"]
    assert store.claim("a", "jobs", 10) == []  # "now" is leased, "later" not yet visible
    clock.now += 30
    assert [m.body for m in store.claim("a", "jobs", 10)] == ["later"]


def test_max_batch_size_caps_a_claim_oldest_first(store):
    for i in range(5):
        send(store, i)
    assert [m.body for m in store.claim("a", "jobs", 3)] == [0, 1, 2]
    assert [m.body for m in store.claim("a", "jobs", 3)] == [3, 4]


def test_a_retry_comes_back_after_its_delay_counting_attempts_then_goes_to_the_dead_letter_queue(
    store, clock
):
    send(store, "flaky")
    for attempt in (1, 2):  # max_retries 2: three attempts in all
        (m,) = store.claim("a", "jobs", 10)
        assert m.attempts == attempt
        assert store.settle("a", "jobs", [], {m.id: 5}, 2, "jobs-dlq") == []
        assert store.claim("a", "jobs", 10) == []  # not before its delay
        clock.now += 5
    (m,) = store.claim("a", "jobs", 10)
    assert m.attempts == 3 and m.body == "flaky"
    assert store.settle("a", "jobs", [], {m.id: 5}, 2, "jobs-dlq") == [(m.id, "deadLettered")]
    assert store.ready("a", "jobs") == 0
    (dead,) = store.claim("a", "jobs-dlq", 10)  # at once, whatever the retry's delay
    assert dead.body == "flaky" and dead.attempts == 1


def test_past_max_retries_without_a_dead_letter_queue_a_message_is_dropped(store):
    send(store, "x")
    (m,) = store.claim("a", "jobs", 10)
    assert store.settle("a", "jobs", [], {m.id: 0}, 0, None) == [(m.id, "dropped")]
    assert store.ready("a", "jobs") == 0


def test_acks_delete_and_ids_of_other_queues_or_accounts_are_ignored(store):
    send(store, "mine")
    send(store, "theirs", account="b")
    (mine,) = store.claim("a", "jobs", 10)
    (theirs,) = store.claim("b", "jobs", 10)
    store.settle("a", "jobs", [mine.id, theirs.id], {}, 3, None)
    store.release_leases()
    assert store.ready("a", "jobs") == 0 and store.ready("b", "jobs") == 1


def test_unsettled_leases_are_released_at_the_next_start(store):
    send(store, "x")
    store.claim("a", "jobs", 10)
    assert store.ready("a", "jobs") == 0
    store.release_leases()
    (m,) = store.claim("a", "jobs", 10)
    assert m.attempts == 2  # delivered at least once: the unsettled delivery counts


def test_producers_are_queue_bindings_reached_through_the_binding_stores(tmp_path):
    refs = binding_refs({"queues.producers": [{"binding": "JOBS", "queue": "jobs"}]})
    assert refs == {"JOBS": BindingRef("queue", "jobs")}
    stores = BindingStores(tmp_path)
    try:
        asyncio.run(stores.call("acct", refs["JOBS"], "send", [{"a": 1}], {}))
        assert [m.body for m in stores.queues.claim("acct", "jobs", 10)] == [{"a": 1}]
    finally:
        stores.close()


def test_consumer_settings_default_as_cloudflare_and_refuse_out_of_range():
    s = ConsumerSettings.from_config(QueueConsumerConfig(queue="jobs"), "queues.consumers.0")
    assert (s.max_batch_size, s.max_batch_timeout, s.max_retries, s.retry_delay) == (10, 5.0, 3, 0)
    with pytest.raises(
        ConsumerError, match=r"queues\.consumers\.0\.max_batch_size: must be between 1 and 100"
    ):
        ConsumerSettings.from_config(
            QueueConsumerConfig(queue="jobs", max_batch_size=101), "queues.consumers.0"
        )
    with pytest.raises(ConsumerError, match="its own dead-letter queue"):
        ConsumerSettings.from_config(
            QueueConsumerConfig(queue="q", dead_letter_queue="q"), "queues.consumers.0"
        )


# --- what the handler sees ---------------------------------------------------------------------------


def batch_of(n: int) -> MessageBatch:
    return MessageBatch("jobs", [(f"m{i}", 1_700_000_000_000, {"i": i}, 1) for i in range(n)])


def test_a_handler_that_returns_acks_what_it_did_not_retry():
    batch = batch_of(3)
    batch.messages[1].retry(delaySeconds=7)
    assert batch.outcome(failed=False) == (["m0", "m2"], {"m1": 7})
    assert batch.queue == "jobs" and batch.messages[0].body == {"i": 0}
    assert batch.messages[0].timestamp.year == 2023 and batch.messages[0].attempts == 1


def test_a_handler_that_raises_retries_what_it_did_not_ack():
    batch = batch_of(3)
    batch.messages[0].ack()
    assert batch.outcome(failed=True) == (["m0"], {"m1": None, "m2": None})


def test_the_first_decision_for_a_message_wins_and_all_applies_to_the_rest():
    batch = batch_of(3)
    batch.messages[0].ack()
    batch.messages[0].retry()
    batch.messages[1].retry({"delaySeconds": 2})
    batch.retryAll(delaySeconds=9)
    batch.ackAll()
    assert batch.outcome(failed=False) == (["m0"], {"m1": 2, "m2": 9})
    other = batch_of(2)
    other.ackAll()
    assert other.outcome(failed=True) == (["m0", "m1"], {})


def test_retry_delays_are_checked_in_the_isolate():
    batch = batch_of(1)
    with pytest.raises(ValueError, match="between 0 and 43200"):
        batch.messages[0].retry(delaySeconds=-1)
    with pytest.raises(TypeError, match="must be a number"):
        batch.retryAll(delaySeconds="soon")


def test_a_batch_crosses_to_a_real_isolate_and_back(tmp_path):
    script = tmp_path / "worker.py"
    script.write_text(
        textwrap.dedent(
            """
            from workers import WorkerEntrypoint

            class Default(WorkerEntrypoint):
                async def queue(self, batch):
                    for m in batch.messages:
                        if m.body == "bad":
                            m.retry(delaySeconds=3)
                    if any(m.body == "boom" for m in batch.messages):
                        batch.messages[0].ack()
                        raise RuntimeError("boom")
            """
        )
    )

    async def go():
        iso = Isolate("q", script, {}, None, limits=IsolateLimits(sandbox=False))
        await iso.start()
        try:
            msgs = [ipc.QueuedMessage("a", 1, "ok", 1), ipc.QueuedMessage("b", 2, "bad", 1)]
            first = await iso.deliver("jobs", msgs)
            msgs = [ipc.QueuedMessage("c", 3, "ok", 1), ipc.QueuedMessage("d", 4, "boom", 2)]
            second = await iso.deliver("jobs", msgs)
            return first, second, iso.entry
        finally:
            await iso.stop()

    (res1, out1), (res2, out2), entry = asyncio.run(go())
    assert entry == "Default.queue"
    assert isinstance(res1, ipc.InvokeResult) and (out1.acked, out1.retried) == (["a"], {"b": 3})
    assert isinstance(res2, ipc.InvokeError) and res2.message == "RuntimeError: boom"
    assert (out2.acked, out2.retried) == (["c"], {"d": None})
