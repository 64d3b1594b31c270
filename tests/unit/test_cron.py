"""kube32.cron: the five-field schedules of CronJobs, table-driven."""
from __future__ import annotations

import datetime as dt

import pytest

from kube32 import cron

UTC = dt.timezone.utc


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


# (schedule, time zone, after, the next time in UTC)
NEXT = [
    ("* * * * *", None, "2026-03-01T10:00:30", "2026-03-01T10:01:00"),
    ("* * * * *", None, "2026-03-01T10:00:00", "2026-03-01T10:01:00"),      # strictly after
    ("*/15 * * * *", None, "2026-03-01T10:01:00", "2026-03-01T10:15:00"),
    ("5/20 * * * *", None, "2026-03-01T10:26:00", "2026-03-01T10:45:00"),   # 5-59/20
    ("0 9-17/4 * * *", None, "2026-03-01T10:00:00", "2026-03-01T13:00:00"),
    ("0 0 1,15 * *", None, "2026-03-02T00:00:00", "2026-03-15T00:00:00"),
    ("30 2 * FEB-MAR *", None, "2026-03-31T03:00:00", "2027-02-01T02:30:00"),
    ("0 12 * * mon-fri", None, "2026-03-06T13:00:00", "2026-03-09T12:00:00"),  # Friday -> Monday
    ("0 0 * * 7", None, "2026-03-02T00:00:00", "2026-03-08T00:00:00"),       # 7 is Sunday
    ("0 0 13 * 5", None, "2026-03-01T00:00:00", "2026-03-06T00:00:00"),      # day OR weekday
    ("0 0 */2 * 5", None, "2026-03-04T01:00:00", "2026-03-05T00:00:00"),     # a step is no star: OR
    ("0 0 * * 5", None, "2026-03-01T00:00:00", "2026-03-06T00:00:00"),       # star day: weekday only
    ("0 0 29 2 *", None, "2026-03-01T00:00:00", "2028-02-29T00:00:00"),
    ("@hourly", None, "2026-03-01T10:00:00", "2026-03-01T11:00:00"),
    ("@daily", None, "2026-03-01T10:00:00", "2026-03-02T00:00:00"),
    ("@midnight", None, "2026-03-01T10:00:00", "2026-03-02T00:00:00"),
    ("@weekly", None, "2026-03-01T10:00:00", "2026-03-08T00:00:00"),
    ("@monthly", None, "2026-03-01T10:00:00", "2026-04-01T00:00:00"),
    ("@yearly", None, "2026-03-01T10:00:00", "2027-01-01T00:00:00"),
    ("@annually", None, "2026-03-01T10:00:00", "2027-01-01T00:00:00"),
    ("0 9 * * *", "Europe/Berlin", "2026-01-10T09:00:00", "2026-01-11T08:00:00"),    # CET = UTC+1
    ("0 9 * * *", "Europe/Berlin", "2026-07-10T09:00:00", "2026-07-11T07:00:00"),    # CEST = UTC+2
    ("30 2 * * *", "Europe/Berlin", "2026-03-28T02:00:00", "2026-03-30T00:30:00"),   # 02:30 skipped on the 29th
    ("0 * * * *", "America/New_York", "2026-11-01T05:30:00", "2026-11-01T07:00:00"),  # 01:00 EST only once
]


@pytest.mark.parametrize("schedule,tz,after,expected", NEXT)
def test_next_after(schedule: str, tz: str | None, after: str, expected: str) -> None:
    assert cron.parse(schedule, tz).next_after(at(after)) == at(expected)


# (schedule, time zone, a part of the error message)
BAD = [
    ("* * * *", None, "expected exactly 5 fields"),
    ("* * * * * *", None, "expected exactly 5 fields"),
    ("60 * * * *", None, "minute: 60 is out of range 0-59"),
    ("* 24 * * *", None, "hour: 24 is out of range"),
    ("* * 0 * *", None, "day of month: 0 is out of range 1-31"),
    ("* * * 13 *", None, "month: 13 is out of range"),
    ("* * * * 8", None, "day of week: 8 is out of range"),
    ("*/0 * * * *", None, "step '0' must be a positive number"),
    ("*/ * * * *", None, "must be a positive number"),
    ("5-1 * * * *", None, "begins after it ends"),
    ("1,,2 * * * *", None, "empty list item"),
    ("x * * * *", None, "minute: 'x' is not a number"),
    ("* * * FOO *", None, "month: 'FOO' is not a number or a name"),
    ("@often", None, "unrecognized descriptor"),
    ("TZ=UTC * * * * *", None, "use timeZone field instead"),
    ("CRON_TZ=UTC * * * * *", None, "use timeZone field instead"),
    ("* * * * *", "Mars/Olympus", "unknown time zone"),
    ("* * * * *", "../etc/passwd", "unknown time zone"),
    ("* " * 200, None, "longer than 256"),
]


@pytest.mark.parametrize("schedule,tz,message", BAD)
def test_bad_schedules_name_their_cause(schedule: str, tz: str | None, message: str) -> None:
    with pytest.raises(cron.CronError, match=None) as e:
        cron.parse(schedule, tz)
    assert message in str(e.value)


def test_a_schedule_that_never_matches_gives_up() -> None:
    with pytest.raises(cron.CronError, match="no time in 5 years"):
        cron.parse("0 0 30 2 *").next_after(at("2026-01-01T00:00:00"))


def test_names_are_case_blind_and_question_mark_is_star() -> None:
    a = cron.parse("0 0 ? jan Sun")
    assert a.months == {1} and a.weekdays == {0} and a.days_star


def test_most_recent_counts_missed_times_and_finds_the_latest_of_many() -> None:
    s = cron.parse("*/10 * * * *")
    assert s.most_recent(at("2026-03-01T10:00:00"), at("2026-03-01T10:05:00")) == (None, 0)
    assert s.most_recent(at("2026-03-01T10:00:00"), at("2026-03-01T10:35:00")) == (at("2026-03-01T10:30:00"), 3)
    latest, count = cron.parse("* * * * *").most_recent(at("2026-03-01T00:00:00"), at("2026-03-05T07:08:09"))
    assert latest == at("2026-03-05T07:08:00") and count == 101
