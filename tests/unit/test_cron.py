"""Cron Triggers' expressions: matching, next fire times, errors, and the loop that fires them."""

import asyncio
from datetime import UTC, datetime

import pytest

from runtime.events.cron import CronError, CronExpression, run_schedule


def at(text: str) -> datetime:
    return datetime.fromisoformat(text).replace(tzinfo=UTC)


def nxt(expr: str, after: str) -> str | None:
    found = CronExpression.parse(expr).next_after(at(after))
    return found.strftime("%Y-%m-%d %H:%M %a") if found else None


@pytest.mark.parametrize(
    "expr, when, fires",
    [
        ("* * * * *", "2026-03-04 05:06", True),
        ("*/5 * * * *", "2026-03-04 05:10", True),
        ("*/5 * * * *", "2026-03-04 05:11", False),
        ("0 * * * *", "2026-03-04 05:00", True),
        ("0 2 * * *", "2026-03-04 02:00", True),
        ("0 2 * * *", "2026-03-04 03:00", False),
        ("15,45 * * * *", "2026-03-04 05:45", True),
        ("10-20/5 * * * *", "2026-03-04 05:15", True),
        ("10-20/5 * * * *", "2026-03-04 05:25", False),
        ("5/20 * * * *", "2026-03-04 05:45", True),  # 5, 25, 45
        ("0 9 * * MON-FRI", "2026-03-06 09:00", True),  # a Friday
        ("0 9 * * MON-FRI", "2026-03-07 09:00", False),  # a Saturday
        ("0 9 * * 2-6", "2026-03-02 09:00", True),  # 1 = Sunday: 2-6 is Monday-Friday
        ("0 17 * * sun", "2026-03-08 17:00", True),
        ("0 17 * * 1", "2026-03-08 17:00", True),  # Sunday
        ("0 0 1 JAN,jul *", "2026-07-01 00:00", True),
        ("0 0 1 1-3 *", "2026-04-01 00:00", False),
        ("0 0 ? * ?", "2026-04-01 00:00", True),
        ("0 9 L * *", "2026-02-28 09:00", True),  # the last day of February 2026
        ("0 9 L * *", "2028-02-28 09:00", False),  # 2028 is a leap year
        ("0 9 L * *", "2028-02-29 09:00", True),
        ("0 9 L-2 * *", "2026-03-29 09:00", True),
        ("0 9 LW * *", "2026-05-29 09:00", True),  # May 31 2026 is a Sunday: Friday 29th
        ("0 9 15W * *", "2026-08-14 09:00", True),  # Aug 15 2026 is a Saturday: Friday 14th
        ("0 9 1W * *", "2026-08-03 09:00", True),  # Aug 1 is a Saturday: Monday 3rd, same month
        ("0 9 31W * *", "2026-05-29 09:00", True),  # May 31 is a Sunday: back to Friday 29th
        ("0 18 * * 6L", "2026-03-27 18:00", True),  # the last Friday of March 2026
        ("0 18 * * FRIL", "2026-03-20 18:00", False),
        ("0 10 * * MON#2", "2026-03-09 10:00", True),  # the second Monday
        ("0 10 * * 2#2", "2026-03-02 10:00", False),  # the first one
        ("0 0 13 * FRI", "2026-03-13 00:00", True),  # both day fields: either matches
        ("0 0 13 * FRI", "2026-03-06 00:00", True),
        ("0 0 13 * FRI", "2026-03-07 00:00", False),
    ],
)
def test_matches(expr, when, fires):
    assert CronExpression.parse(expr).matches(at(when)) is fires


@pytest.mark.parametrize(
    "expr, after, expected",
    [
        ("* * * * *", "2026-03-04 05:06:30", "2026-03-04 05:07 Wed"),
        ("*/15 * * * *", "2026-03-04 05:45", "2026-03-04 06:00 Wed"),
        ("0 2 * * *", "2026-03-04 02:00", "2026-03-05 02:00 Thu"),
        ("0 0 1 * *", "2026-12-15 00:00", "2027-01-01 00:00 Fri"),
        ("30 9 * * MON", "2026-03-04 00:00", "2026-03-09 09:30 Mon"),
        ("0 0 29 2 *", "2026-01-01 00:00", "2028-02-29 00:00 Tue"),
        ("0 12 L * *", "2026-02-01 00:00", "2026-02-28 12:00 Sat"),
        ("0 10 * * MON#2", "2026-03-10 00:00", "2026-04-13 10:00 Mon"),
        ("0 0 30 2 *", "2026-01-01 00:00", None),  # never
    ],
)
def test_next_fire_times(expr, after, expected):
    assert nxt(expr, after) == expected


def test_times_are_utc():
    from datetime import timedelta, timezone

    seoul = timezone(timedelta(hours=9))
    expr = CronExpression.parse("0 2 * * *")
    assert expr.matches(datetime(2026, 3, 4, 11, 0, tzinfo=seoul))  # 02:00 UTC


@pytest.mark.parametrize(
    "expr, fragment",
    [
        ("* * * *", "expected 5 fields"),
        ("60 * * * *", "minute: 60 is outside 0-59"),
        ("* 24 * * *", "hour: 24 is outside 0-23"),
        ("* * 0 * *", "day of month: 0 is outside 1-31"),
        ("* * * 13 *", "month: 13 is outside 1-12"),
        ("* * * * 0", "day of week: 0 is outside 1-7 (1 = Sunday)"),
        ("* * * FOO *", "or a name (JAN-DEC)"),
        ("*/0 * * * *", "step '0' must be a positive number"),
        ("30-10 * * * *", "goes backwards"),
        ("* * * * MON#6", "1-5"),
        ("1,,2 * * * *", "empty item"),
    ],
)
def test_bad_expressions_say_what_to_change(expr, fragment):
    with pytest.raises(CronError, match="cron .*" + fragment.replace("(", r"\(").replace(")", r"\)")):
        CronExpression.parse(expr)


def test_the_loop_fires_matching_crons_each_minute_and_skips_missed_ones():
    now = [at("2026-03-04 05:58:30").timestamp()]
    fired: list[tuple[str, int]] = []

    async def sleep(seconds):
        now[0] += seconds
        if now[0] > at("2026-03-04 06:01:30").timestamp():
            now[0] += 3600  # the laptop slept: those minutes are not caught up
        if now[0] > at("2026-03-04 07:04:00").timestamp():
            raise asyncio.CancelledError
        await asyncio.sleep(0)

    async def fire(cron, ms):
        fired.append((cron, ms))

    crons = [CronExpression.parse(c) for c in ("* * * * *", "0 * * * *")]

    async def go():
        with pytest.raises(asyncio.CancelledError):
            await run_schedule(crons, fire, clock=lambda: now[0], sleep=sleep)
        await asyncio.sleep(0)

    asyncio.run(go())
    minute = lambda t: int(at(t).timestamp() * 1000)  # noqa: E731
    assert ("* * * * *", minute("2026-03-04 05:59")) in fired
    assert ("0 * * * *", minute("2026-03-04 06:00")) in fired
    assert ("* * * * *", minute("2026-03-04 06:00")) in fired
    assert ("* * * * *", minute("2026-03-04 05:58")) not in fired  # under way when the loop began
    assert not [f for f in fired if minute("2026-03-04 06:02") <= f[1] < minute("2026-03-04 07:02")]
