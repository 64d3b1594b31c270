"""Cron schedules, as a CronJob's ``spec.schedule`` and ``spec.timeZone`` give them.

The syntax is the standard five fields that Kubernetes accepts (robfig/cron's
``ParseStandard``): ``minute hour day-of-month month day-of-week``, each a list
(``1,5``) of ``*``, a value, a range (``1-5``), or either with a step (``*/15``,
``1-30/10``, ``5/10`` = ``5-max/10``); months and weekdays also by name (``JAN``,
``mon``; case does not matter); ``?`` is ``*``; day-of-week ``7`` is Sunday as ``0``.
The descriptors ``@yearly`` (``@annually``), ``@monthly``, ``@weekly``, ``@daily``
(``@midnight``) and ``@hourly`` stand for their five fields.  ``TZ=`` or ``CRON_TZ=`` in
the schedule is refused, as Kubernetes does: the time zone is ``spec.timeZone``.

Invariants:

* when both day fields are restricted (neither starts with ``*`` or ``?`` without a
  step) a day matches when *either* matches, as in cron; otherwise both must;
* times are matched on the wall clock of the schedule's zone; a wall time that does
  not exist there (a daylight-saving gap) never matches, one that exists twice
  matches its first occurrence only;
* :meth:`Schedule.next_after` is strictly after its argument, to the minute, and
  gives up (CronError) after five years without a match (``0 0 30 2 *``);
* everything is bounded: a schedule is at most :data:`MAX_SCHEDULE` characters.

Imports nothing of Kube32.
"""
from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

MAX_SCHEDULE = 256
SEARCH_YEARS = 5

_MONTHS = {n: i + 1 for i, n in enumerate("JAN FEB MAR APR MAY JUN JUL AUG SEP OCT NOV DEC".split())}
_DAYS = {n: i for i, n in enumerate("SUN MON TUE WED THU FRI SAT".split())}
DESCRIPTORS = {"@yearly": "0 0 1 1 *", "@annually": "0 0 1 1 *", "@monthly": "0 0 1 * *",
               "@weekly": "0 0 * * 0", "@daily": "0 0 * * *", "@midnight": "0 0 * * *",
               "@hourly": "0 * * * *"}


class CronError(ValueError):
    """A schedule or time zone that cannot be used (the message names the cause)."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    names: dict[str, int] | None = None


_FIELDS = (_Field("minute", 0, 59), _Field("hour", 0, 23), _Field("day of month", 1, 31),
           _Field("month", 1, 12, _MONTHS), _Field("day of week", 0, 7, _DAYS))


def _value(text: str, f: _Field) -> int:
    if f.names and text.upper() in f.names:
        return f.names[text.upper()]
    if not text.isdigit():
        raise CronError(f"{f.name}: {text!r} is not a number" + (" or a name" if f.names else ""))
    n = int(text)
    if not f.low <= n <= f.high:
        raise CronError(f"{f.name}: {n} is out of range {f.low}-{f.high}")
    return n


def _part(text: str, f: _Field) -> tuple[set[int], bool]:
    """One comma-separated part: its values, and whether it is a bare star."""
    rng, _, step_text = text.partition("/")
    step = 1
    if step_text or "/" in text:
        if not step_text.isdigit() or int(step_text) == 0:
            raise CronError(f"{f.name}: step {step_text!r} must be a positive number")
        step = int(step_text)
    star = rng in ("*", "?")
    if star:
        low, high = f.low, f.high
    elif "-" in rng:
        a, _, b = rng.partition("-")
        low, high = _value(a, f), _value(b, f)
        if low > high:
            raise CronError(f"{f.name}: range {rng!r} begins after it ends")
    else:
        low = _value(rng, f)
        high = f.high if step_text else low
    if f.name == "day of week" and star:
        high = 6
    return set(range(low, high + 1, step)), star and step == 1


def _parse_field(text: str, f: _Field) -> tuple[frozenset[int], bool]:
    values: set[int] = set()
    star = False
    for part in text.split(","):
        if not part:
            raise CronError(f"{f.name}: empty list item in {text!r}")
        got, is_star = _part(part, f)
        values |= got
        star = star or is_star
    if f.name == "day of week" and 7 in values:
        values = (values - {7}) | {0}
    return frozenset(values), star


def zone(name: str | None) -> dt.tzinfo:
    """The IANA zone of ``spec.timeZone`` (None or empty: UTC, the controller's zone)."""
    if not name:
        return dt.timezone.utc
    if len(name) > 64 or name.startswith(("/", ".")) or ".." in name or "\\" in name:
        raise CronError(f"unknown time zone {name!r}")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as e:
        raise CronError(f"unknown time zone {name!r}") from e


@dataclass(frozen=True)
class Schedule:
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]   # 0 = Sunday
    days_star: bool
    weekdays_star: bool
    tz: dt.tzinfo = dt.timezone.utc

    def day_matches(self, d: dt.datetime) -> bool:
        dom = d.day in self.days
        dow = (d.isoweekday() % 7) in self.weekdays
        if self.days_star or self.weekdays_star:
            return dom and dow
        return dom or dow

    def _exists(self, wall: dt.datetime) -> dt.datetime | None:
        """The instant of a wall time in the zone, or None when the zone skips it."""
        aware = wall.replace(tzinfo=self.tz, fold=0)
        back = aware.astimezone(dt.timezone.utc).astimezone(self.tz).replace(tzinfo=None)
        return aware if back == wall else None

    def next_after(self, t: dt.datetime) -> dt.datetime:
        """The first time strictly after ``t`` (aware) that matches, in UTC."""
        if t.tzinfo is None:
            raise ValueError("next_after needs an aware datetime")
        wall = t.astimezone(self.tz).replace(tzinfo=None, second=0, microsecond=0) + dt.timedelta(minutes=1)
        limit = wall.year + SEARCH_YEARS
        while wall.year <= limit:
            if wall.month not in self.months:
                wall = (wall.replace(day=1, hour=0, minute=0) + dt.timedelta(days=32)).replace(day=1)
            elif not self.day_matches(wall):
                wall = wall.replace(hour=0, minute=0) + dt.timedelta(days=1)
            elif wall.hour not in self.hours:
                wall = wall.replace(minute=0) + dt.timedelta(hours=1)
            elif wall.minute not in self.minutes:
                wall += dt.timedelta(minutes=1)
            else:
                aware = self._exists(wall)
                if aware is not None and aware > t:
                    return aware.astimezone(dt.timezone.utc)
                wall += dt.timedelta(minutes=1)
        raise CronError(f"no time in {SEARCH_YEARS} years matches the schedule")

    def most_recent(self, earliest: dt.datetime, now: dt.datetime) -> tuple[dt.datetime | None, int]:
        """The latest matching time in (earliest, now], and how many there were (counted
        up to 101, as Kubernetes stops counting): (None, 0) when none."""
        first = self.next_after(earliest)
        if first > now:
            return None, 0
        count, t = 1, first
        while count <= 100:
            nxt = self.next_after(t)
            if nxt > now:
                return t, count
            t, count = nxt, count + 1
        # Many missed: find the latest by bisection on next_after (monotone), ~20 steps.
        lo, hi = t, now
        while (hi - lo) > dt.timedelta(minutes=1):
            mid = lo + (hi - lo) / 2
            if self.next_after(mid) <= now:
                lo = mid
            else:
                hi = mid
        return self.next_after(lo), count


def parse(schedule: str, time_zone: str | None = None) -> Schedule:
    """A schedule (and ``spec.timeZone``) as a :class:`Schedule`; CronError names what is wrong."""
    if not isinstance(schedule, str):
        raise CronError("the schedule must be a string")
    if len(schedule) > MAX_SCHEDULE:
        raise CronError(f"the schedule is longer than {MAX_SCHEDULE} characters")
    text = schedule.strip()
    if text.upper().startswith(("TZ=", "CRON_TZ=")):
        raise CronError("cannot use TZ or CRON_TZ in schedule, use timeZone field instead")
    if text.startswith("@"):
        if text.lower() not in DESCRIPTORS:
            raise CronError(f"unrecognized descriptor: {text}")
        text = DESCRIPTORS[text.lower()]
    parts = text.split()
    if len(parts) != 5:
        raise CronError(f"expected exactly 5 fields, found {len(parts)}: {schedule!r}")
    parsed = [_parse_field(p, f) for p, f in zip(parts, _FIELDS, strict=True)]
    return Schedule(minutes=parsed[0][0], hours=parsed[1][0], days=parsed[2][0], months=parsed[3][0],
                    weekdays=parsed[4][0], days_star=parsed[2][1], weekdays_star=parsed[4][1],
                    tz=zone(time_zone))
