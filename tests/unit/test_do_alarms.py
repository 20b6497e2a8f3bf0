"""A Durable Object's alarm as its storage keeps it (runtime.bindings.do_storage): one per object,
hidden from its SQL, retried with backoff up to Cloudflare's limit, found again by the scan a
restart makes; and the SDK's setAlarm times."""

import asyncio
import datetime

import pytest

from runtime.bindings import BindingStores
from runtime.bindings.common import BindingError
from runtime.bindings.do_storage import ALARM_BACKOFF_S, ALARM_RETRIES
from runtime.events.alarms import AlarmScheduler
from workers.durable_objects import alarm_time_ms

ADDRESS = ("acct", "w", "Clock", "a" * 64)


def _call(stores, method, args, address=ADDRESS):
    return stores.objects.call(*address, method, args, {})


def test_one_alarm_per_object_set_moved_deleted_and_hidden_from_sql(tmp_path):
    stores = BindingStores(tmp_path)
    assert _call(stores, "getAlarm", []) is None
    _call(stores, "setAlarm", [1_000])
    _call(stores, "setAlarm", [2_000])  # moved: still one
    assert _call(stores, "getAlarm", []) == 2_000
    assert _call(stores, "getAlarm", [], ("acct", "w", "Clock", "b" * 64)) is None  # another object's
    for sql in ("SELECT * FROM __cf_alarm", "UPDATE __cf_alarm SET time_ms = 0", "DROP TABLE __cf_alarm"):
        with pytest.raises(BindingError):
            _call(stores, "sql.exec", [sql, []])
    for bad in (-1, 2**53, "soon", True, 1.5):
        with pytest.raises(BindingError, match="ms since the epoch"):
            _call(stores, "setAlarm", [bad])
    _call(stores, "deleteAlarm", [])
    assert _call(stores, "getAlarm", []) is None
    stores.close()


def test_a_failing_alarm_is_retried_with_backoff_then_dropped(tmp_path):
    stores = BindingStores(tmp_path)
    objects = stores.objects
    _call(stores, "setAlarm", [5_000])
    due, now = 5_000, 10_000
    for retry in range(ALARM_RETRIES):
        assert objects.begin_alarm(ADDRESS, due) == retry
        assert _call(stores, "getAlarm", []) is None  # while its handler runs
        due = objects.end_alarm(ADDRESS, False, now)
        assert due == now + int(ALARM_BACKOFF_S * 1000 * 2**retry)
    assert objects.begin_alarm(ADDRESS, due) == ALARM_RETRIES
    assert objects.end_alarm(ADDRESS, False, now) is None  # the last try failed: gone
    assert _call(stores, "getAlarm", []) is None

    _call(stores, "setAlarm", [7_000])
    assert objects.begin_alarm(ADDRESS, 6_999) is None  # moved since: not this one
    assert objects.begin_alarm(ADDRESS, 7_000) == 0
    _call(stores, "setAlarm", [9_000])  # the handler set a new one: it stands, failed or not
    assert objects.end_alarm(ADDRESS, False, now) == 9_000
    assert objects.begin_alarm(ADDRESS, 9_000) == 0
    assert objects.end_alarm(ADDRESS, True, now) is None
    stores.close()


def test_the_scan_at_start_finds_each_alarm_in_its_own_file_only(tmp_path):
    stores = BindingStores(tmp_path)
    _call(stores, "setAlarm", [1_234])
    other = ("acct", "w", "Clock", "c" * 64)
    _call(stores, "setAlarm", [5_678], other)
    _call(stores, "get", ["x"], ("acct", "w", "Clock", "d" * 64))  # a file with no alarm
    stores.close()
    # a file copied under another object's name must not wake the object it names
    copy = BindingStores(tmp_path).objects
    copy.path(*ADDRESS).with_name("e" * 64 + ".sqlite").write_bytes(copy.path(*ADDRESS).read_bytes())
    assert sorted(copy.scan_alarms()) == [(ADDRESS, 1_234), (other, 5_678)]
    assert copy.scan_alarms(limit=1) in ([(ADDRESS, 1_234)], [(other, 5_678)], [])
    copy.close()


def test_set_alarm_takes_a_datetime_or_epoch_ms():
    moment = datetime.datetime(2030, 1, 2, 3, 4, 5, tzinfo=datetime.UTC)
    assert alarm_time_ms(moment) == int(moment.timestamp() * 1000)
    assert alarm_time_ms(moment.replace(tzinfo=None)) == int(moment.timestamp() * 1000)  # naive: UTC
    assert alarm_time_ms(1_700_000_000_000) == 1_700_000_000_000
    assert alarm_time_ms(1.5e12) == 1_500_000_000_000
    for bad in ("tomorrow", None, True, float("nan"), -5, 2**60):
        with pytest.raises(TypeError, match="setAlarm"):
            alarm_time_ms(bad)


def test_due_alarms_run_in_time_order_and_one_account_cannot_take_every_slot(tmp_path):
    stores = BindingStores(tmp_path)
    busy = [("busy", "w", "Clock", f"{i:064x}") for i in range(8)]
    for i, address in enumerate(busy):
        _call(stores, "setAlarm", [1_000 + i], address)
    calm = ("calm", "w", "Clock", "f" * 64)
    _call(stores, "setAlarm", [2_000], calm)  # due after every one of busy's
    order: list[str] = []

    async def scenario():
        release = asyncio.Event()

        async def fire(address, retries, due_ms):
            order.append(address[0])
            await release.wait()  # each handler runs until the test lets them all go
            return "ok"

        scheduler = AlarmScheduler(stores.objects, stores.run, fire, running=4, per_account=2)
        task = asyncio.create_task(scheduler.run())
        while len(order) < 3:
            await asyncio.sleep(0.01)
        assert sorted(order) == ["busy", "busy", "calm"]  # busy holds 2 slots; calm is not kept waiting
        release.set()
        while scheduler.fired < 9:
            await asyncio.sleep(0.01)
        task.cancel()

    asyncio.run(scenario())
    assert order.count("busy") == 8
    assert all(_call(stores, "getAlarm", [], a) is None for a in [*busy, calm])  # each ran once, done
    stores.close()


def test_storage_calls_of_a_fresh_object_are_never_cut_by_a_deadline_they_did_not_have(tmp_path):
    # the statement deadline is set for every KV call: a stale one (none yet on a fresh file) used to
    # interrupt any put, get or list over SQLite's 1000-step progress interval ("storage: interrupted")
    stores = BindingStores(tmp_path)
    entries = {f"key-{i:03}": {"n": i, "text": "x" * 100} for i in range(128)}
    assert _call(stores, "put", [entries]) is None
    assert _call(stores, "get", [list(entries)[:100]]) == {k: entries[k] for k in list(entries)[:100]}
    assert len(stores.objects.call(*ADDRESS, "list", [], {"prefix": "key-"})) == 128
    stores.close()
