"""Cron Triggers: Cloudflare's cron expressions, and the loop `edge dev` fires them from.

Five fields, in UTC: minute (0-59), hour (0-23), day of month (1-31), month (1-12 or JAN-DEC)
and day of week (1-7 or SUN-SAT, 1 = Sunday, as Cloudflare's Quartz-style syntax has it). Each
field takes `*`, a value, a range `a-b`, a step `*/n`, `a/n` or `a-b/n`, and lists `a,b-c`. The
day of month also takes `L` (the last day), `L-n` (n days before it), `nW` (the weekday nearest
day n, within the month) and `LW` (the last weekday); the day of week takes `nL` / `FRIL` (the
last such day of the month) and `n#k` / `MON#2` (the k-th such day). `?` is `*`. When both day
fields are restricted, a day matches either (as classic cron does).
"""

from __future__ import annotations

import asyncio
import calendar
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta

log = logging.getLogger("edge.cron")

MONTHS = {name: i for i, name in enumerate(calendar.month_abbr) if name}  # JAN=1 ... DEC=12 (title case)
DAYS = {"SUN": 1, "MON": 2, "TUE": 3, "WED": 4, "THU": 5, "FRI": 6, "SAT": 7}
SEARCH_DAYS = 366 * 9  # a schedule that fires at all fires within this (Feb 29 skips 2100)


class CronError(ValueError):
    """The expression cannot be read; the message names the field and what is accepted."""


def _weekday(d: date) -> int:
    """Cloudflare's day-of-week number of `d`: 1 = Sunday ... 7 = Saturday."""
    return (d.weekday() + 1) % 7 + 1


def _last_day(d: date) -> int:
    return calendar.monthrange(d.year, d.month)[1]


def _last_weekday(d: date) -> int:
    last = _last_day(d)
    return last - {5: 1, 6: 2}.get(d.replace(day=last).weekday(), 0)


def _nearest_weekday(d: date, day: int) -> int | None:
    """The weekday (Mon-Fri) nearest day `day` of d's month, not leaving the month (Quartz's W)."""
    last = _last_day(d)
    if day > last:
        return None
    target = d.replace(day=day)
    wd = target.weekday()  # 0 = Monday
    if wd == 5:  # Saturday: Friday before, or Monday after when the 1st
        return day - 1 if day > 1 else day + 2
    if wd == 6:  # Sunday: Monday after, or Friday before when the last day
        return day + 1 if day < last else day - 2
    return day


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] = field(default_factory=dict)
    spelled: str = ""  # how the names run, for messages

    def value(self, text: str) -> int:
        key = text.upper()
        if key in self.names:
            return self.names[key]
        if not text.isdigit():
            allowed = f" or a name ({self.spelled})" if self.names else ""
            raise CronError(f"{self.name}: {text!r} is not a number{allowed}")
        n = int(text)
        if not self.low <= n <= self.high:
            extra = " (1 = Sunday)" if self.name == "day of week" else ""
            raise CronError(f"{self.name}: {n} is outside {self.low}-{self.high}{extra}")
        return n

    def parse(self, text: str) -> frozenset[int]:
        values: set[int] = set()
        for part in text.split(","):
            if not part:
                raise CronError(f"{self.name}: empty item in {text!r}")
            base, _, step_text = part.partition("/")
            step = 1
            if step_text:
                if not step_text.isdigit() or int(step_text) == 0:
                    raise CronError(f"{self.name}: step {step_text!r} must be a positive number")
                step = int(step_text)
            if base in ("*", "?"):
                lo, hi = self.low, self.high
            elif "-" in base:
                a, _, b = base.partition("-")
                lo, hi = self.value(a), self.value(b)
                if lo > hi:
                    raise CronError(f"{self.name}: range {base!r} goes backwards; write it low-high")
            else:
                lo = self.value(base)
                hi = self.high if step_text else lo
            values.update(range(lo, hi + 1, step))
        return frozenset(values)


MINUTE = _Field("minute", 0, 59)
HOUR = _Field("hour", 0, 23)
DAY_OF_MONTH = _Field("day of month", 1, 31)
MONTH = _Field("month", 1, 12, {k.upper(): v for k, v in MONTHS.items()}, "JAN-DEC")
DAY_OF_WEEK = _Field("day of week", 1, 7, DAYS, "SUN-SAT")


def _day_of_month_rule(text: str) -> Callable[[date], bool]:
    """A predicate for the day-of-month field, its L and W forms included."""
    rules: list[Callable[[date], bool]] = []
    plain: list[str] = []
    for part in text.split(","):
        key = part.upper()
        if key == "L":
            rules.append(lambda d: d.day == _last_day(d))
        elif key == "LW":
            rules.append(lambda d: d.day == _last_weekday(d))
        elif key.startswith("L-") and key[2:].isdigit():
            back = int(key[2:])
            if back > 30:
                raise CronError(f"day of month: {part!r}: at most L-30")
            rules.append(lambda d, back=back: d.day == _last_day(d) - back)
        elif key.endswith("W") and key[:-1].isdigit():
            day = DAY_OF_MONTH.value(key[:-1])
            rules.append(lambda d, day=day: d.day == _nearest_weekday(d, day))
        else:
            plain.append(part)
    if plain:
        days = DAY_OF_MONTH.parse(",".join(plain))
        rules.append(lambda d: d.day in days)
    return lambda d: any(rule(d) for rule in rules)


def _day_of_week_rule(text: str) -> Callable[[date], bool]:
    """A predicate for the day-of-week field, its L (last) and # (n-th) forms included."""
    rules: list[Callable[[date], bool]] = []
    plain: list[str] = []
    for part in text.split(","):
        key = part.upper()
        if "#" in key:
            day_text, _, nth_text = key.partition("#")
            wd = DAY_OF_WEEK.value(day_text)
            if not nth_text.isdigit() or not 1 <= int(nth_text) <= 5:
                raise CronError(f"day of week: {part!r}: the n in DAY#n is 1-5")
            nth = int(nth_text)
            rules.append(lambda d, wd=wd, nth=nth: _weekday(d) == wd and (d.day - 1) // 7 + 1 == nth)
        elif key == "L":  # alone: the last day of the week, Saturday
            rules.append(lambda d: _weekday(d) == 7)
        elif key.endswith("L") and len(key) > 1:
            wd = DAY_OF_WEEK.value(key[:-1])
            rules.append(lambda d, wd=wd: _weekday(d) == wd and d.day + 7 > _last_day(d))
        else:
            plain.append(part)
    if plain:
        days = DAY_OF_WEEK.parse(",".join(plain))
        rules.append(lambda d: _weekday(d) in days)
    return lambda d: any(rule(d) for rule in rules)


def _unrestricted(text: str) -> bool:
    return text in ("*", "?")


@dataclass(frozen=True)
class CronExpression:
    """One parsed cron expression; `matches(t)` and `next_after(t)` work in UTC."""

    text: str
    minutes: frozenset[int]
    hours: frozenset[int]
    months: frozenset[int]
    _day: Callable[[date], bool] = field(repr=False, compare=False)

    @classmethod
    def parse(cls, text: str) -> CronExpression:
        fields = text.split()
        if len(fields) != 5:
            raise CronError(
                f"cron {text!r}: expected 5 fields (minute hour day-of-month month day-of-week), "
                f"got {len(fields)}"
            )
        minute, hour, dom, month, dow = fields
        try:
            dom_rule, dow_rule = _day_of_month_rule(dom), _day_of_week_rule(dow)
            if _unrestricted(dom) and _unrestricted(dow):
                day = lambda d: True  # noqa: E731
            elif _unrestricted(dom):
                day = dow_rule
            elif _unrestricted(dow):
                day = dom_rule
            else:  # both restricted: either matches, as in classic cron
                day = lambda d: dom_rule(d) or dow_rule(d)  # noqa: E731
            return cls(text, MINUTE.parse(minute), HOUR.parse(hour), MONTH.parse(month), day)
        except CronError as exc:
            raise CronError(f"cron {text!r}: {exc}") from None

    def matches(self, when: datetime) -> bool:
        when = _utc(when)
        return (
            when.minute in self.minutes
            and when.hour in self.hours
            and when.month in self.months
            and self._day(when.date())
        )

    def next_after(self, when: datetime) -> datetime | None:
        """The first minute strictly after `when` that this expression fires at (None: never)."""
        start = _utc(when).replace(second=0, microsecond=0) + timedelta(minutes=1)
        hours, minutes = sorted(self.hours), sorted(self.minutes)
        day = start.date()
        for offset in range(SEARCH_DAYS):
            d = day + timedelta(days=offset)
            if d.month not in self.months or not self._day(d):
                continue
            for h in hours:
                for m in minutes:
                    at = datetime(d.year, d.month, d.day, h, m, tzinfo=UTC)
                    if at >= start:
                        return at
        return None


def _utc(when: datetime) -> datetime:
    return when.replace(tzinfo=UTC) if when.tzinfo is None else when.astimezone(UTC)


def parse_all(crons: list[str]) -> list[CronExpression]:
    return [CronExpression.parse(c) for c in crons]


async def run_schedule(
    crons: list[CronExpression],
    fire: Callable[[str, int], Awaitable[object]],
    clock: Callable[[], float] = time.time,
    sleep: Callable[[float], Awaitable[object]] = asyncio.sleep,
) -> None:
    """Wake at each minute's start and fire every expression that matches it, with the minute's
    time in ms since the epoch (a minute slept through, as on a suspended laptop, is skipped, not
    caught up). Each firing runs as its own task: a slow handler never delays the next minute."""
    if not crons:
        return
    running: set[asyncio.Task] = set()
    fired = int(clock() // 60)  # the minute already under way when the loop began is not fired
    while True:
        now = clock()
        await sleep(max(0.0, (int(now // 60) + 1) * 60 - now + 0.001))
        minute = int(clock() // 60)
        if minute <= fired:
            continue
        fired = minute
        at = datetime.fromtimestamp(minute * 60, UTC)
        for cron in crons:
            if cron.matches(at):
                task = asyncio.create_task(_fire_one(fire, cron.text, minute * 60_000))
                running.add(task)
                task.add_done_callback(running.discard)


async def _fire_one(fire: Callable[[str, int], Awaitable[object]], cron: str, at_ms: int) -> None:
    try:
        await fire(cron, at_ms)
    except Exception:  # one failed firing must not stop the schedule
        log.exception("scheduled event for %r failed", cron)
