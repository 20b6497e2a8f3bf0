"""The dashboard stream's bounds (runtime.control.dashboard_feed): a browser that never reads holds a
fixed number of events and one snapshot, whatever the runtime publishes; a reading one gets every
event; the number of browsers, accounts, buckets and samples is capped; sessions expire."""

import asyncio
import json

from runtime.control import dashboard_feed as feed_module
from runtime.control.dashboard_feed import (
    CLIENT_EVENTS,
    MAX_ACCOUNTS,
    SERIES_BUCKETS,
    SERIES_SECONDS,
    WINDOW_REQUESTS,
    DashboardFeed,
)
from runtime.control.dashboard_sessions import MAX_SESSIONS, SESSION_SECONDS, DashboardSessions


class Clock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def entry(i: int) -> dict:
    return {"account": "a", "worker": "w", "outcome": "ok", "status": 200, "path": f"/{i}"}


def decode(data: bytes) -> tuple[str, dict]:
    event, payload = data.decode().strip().split("\n")
    return event.removeprefix("event: "), json.loads(payload.removeprefix("data: "))


def test_a_browser_that_never_reads_holds_a_fixed_window_and_the_newest_snapshot():
    feed = DashboardFeed()
    stuck = feed.join()
    assert stuck is not None
    for i in range(5_000):
        feed.request(entry(i))
        if i % 10 == 0:
            feed.publish_snapshot({"n": i})
    assert len(stuck.events) == CLIENT_EVENTS
    assert stuck.dropped == 5_000 - CLIENT_EVENTS
    assert len(feed.requests) == WINDOW_REQUESTS  # the runtime's own window is fixed too
    sent = stuck.take()
    # one snapshot (the newest, coalesced), then the newest CLIENT_EVENTS requests in order
    assert [decode(d)[1] for d in sent[:1]] == [{"n": 4_990}]
    paths = [decode(d)[1]["path"] for d in sent[1:]]
    assert paths == [f"/{i}" for i in range(5_000 - CLIENT_EVENTS, 5_000)]
    assert stuck.take() == []


def test_a_reading_browser_gets_every_event_while_a_stuck_one_beside_it_loses_only_its_own():
    async def run():
        feed = DashboardFeed()
        reader, stuck = feed.join(), feed.join()
        got: list[str] = []

        async def read():
            while len(got) < 1_000:
                for data in await reader.next(timeout=5):
                    got.append(decode(data)[1]["path"])

        task = asyncio.create_task(read())
        for i in range(1_000):
            feed.request(entry(i))
            if i % 8 == 0:
                await asyncio.sleep(0)  # the reader runs between bursts, as the event loop would let it
        await asyncio.wait_for(task, 10)
        return got, stuck

    got, stuck = asyncio.run(run())
    assert got == [f"/{i}" for i in range(1_000)]
    assert len(stuck.events) == CLIENT_EVENTS and stuck.dropped == 1_000 - CLIENT_EVENTS


def test_many_browsers_are_capped_and_a_departed_one_frees_its_place():
    feed = DashboardFeed(max_clients=4)
    clients = [feed.join() for _ in range(4)]
    assert all(c is not None for c in clients)
    assert feed.join() is None
    feed.leave(clients[0])
    late = feed.join()
    assert late is not None
    feed.request(entry(1))
    assert clients[0].events == type(clients[0].events)()  # a departed browser gets nothing more
    assert len(late.events) == 1


def test_a_new_browser_starts_with_the_recent_window_not_the_whole_history():
    feed = DashboardFeed()
    for i in range(WINDOW_REQUESTS * 2):
        feed.request(entry(i))
    client = feed.join()
    assert client is not None and client.dropped == 0
    paths = [decode(d)[1]["path"] for d in client.take()]
    assert paths == [f"/{i}" for i in range(WINDOW_REQUESTS * 2 - CLIENT_EVENTS, WINDOW_REQUESTS * 2)]


def test_series_accounts_and_samples_are_bounded():
    clock = Clock()
    feed = DashboardFeed(clock=clock)
    for _ in range(SERIES_BUCKETS * 3):
        for _ in range(feed_module.BUCKET_SAMPLES + 50):
            feed.ai_call("a", "m", 5, 7, 10.0, 2.0, 30.0)
        clock.t += SERIES_SECONDS
    assert len(feed.series.buckets) == SERIES_BUCKETS
    assert all(len(b["ttft"]) == feed_module.BUCKET_SAMPLES for b in feed.series.buckets)
    newest = feed.series.view()[-1]
    assert newest["tok_s"] == round((feed_module.BUCKET_SAMPLES + 50) * 7 / SERIES_SECONDS, 2)
    for i in range(MAX_ACCOUNTS + 10):
        feed.rate_limited(f"acct-{i}", "m", "rpm")
    assert len(feed.accounts) == MAX_ACCOUNTS
    assert "acct-0" not in feed.accounts and f"acct-{MAX_ACCOUNTS + 9}" in feed.accounts


def test_ttft_percentiles_cover_the_last_minute_only():
    clock = Clock()
    feed = DashboardFeed(clock=clock)
    feed.ai_call("a", "m", 1, 1, 900.0, 1.0, 1.0)
    clock.t += 61
    for ms in (10.0, 20.0, 30.0):
        feed.ai_call("a", "m", 1, 1, ms, 1.0, 1.0)
    view = feed.accounts_view()["a"]
    assert view["requests"] == 4 and view["ttft_p99"] == 30.0 and view["ttft_p50"] == 20.0
    assert feed.model_p99_ttft("m") == 30.0 and feed.model_p99_ttft("other") is None


def test_sessions_expire_are_capped_and_refuse_made_up_ids():
    clock = Clock(0.0)
    sessions = DashboardSessions(clock=clock)
    first = sessions.open()
    assert sessions.valid(first)
    assert not sessions.valid(first[:-1]) and not sessions.valid("") and not sessions.valid(None)
    assert not sessions.valid("x" * 10_000)
    clock.t += SESSION_SECONDS + 1
    assert not sessions.valid(first)
    opened = [sessions.open() for _ in range(MAX_SESSIONS + 1)]
    assert not sessions.valid(opened[0]) and sessions.valid(opened[-1])
    sessions.close(opened[-1])
    assert not sessions.valid(opened[-1])


def test_closing_ends_every_open_stream_at_once_and_refuses_new_ones():
    async def run():
        feed = DashboardFeed()
        waiting = [feed.join() for _ in range(3)]
        reads = [asyncio.create_task(c.next(timeout=60)) for c in waiting]
        await asyncio.sleep(0)
        feed.close()  # edge dev was told to stop: uvicorn waits for every open response
        return await asyncio.wait_for(asyncio.gather(*reads), 5), feed.join()

    ended, late = asyncio.run(run())
    assert ended == [None, None, None] and late is None


def test_the_series_view_follows_the_current_bucket_as_it_fills():
    clock = Clock()
    feed = DashboardFeed(clock=clock)
    feed.ai_call("a", "m", 1, 10, 5.0, 1.0, 9.0)
    clock.t += SERIES_SECONDS
    feed.ai_call("a", "m", 1, 10, 50.0, 1.0, 9.0)
    before = feed.series.view()
    feed.ai_call("a", "m", 1, 10, 70.0, 1.0, 9.0)
    after = feed.series.view()
    assert before[0] == after[0] and after[0]["ttft_p99"] == 5.0
    assert before[1]["tok_s"] == 2.0 and after[1]["tok_s"] == 4.0 and after[1]["ttft_p99"] == 70.0
