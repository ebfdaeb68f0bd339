"""Parse human time specs ("noon", "2h ago", ISO 8601, epoch...) in a remote host's timezone.

Pure functions, no I/O.  ``now`` is always the *remote host's* aware "now"
(build it with :func:`host_now`), and every result is aware in that same tz.

DST rules:

* Wall-clock forms (``noon``, ``today 9:30``, ``HH:MM``, naive ISO...) are built
  with the host tz and resolved by zoneinfo.  A wall time that does not exist
  (spring-forward gap) resolves the zoneinfo way (fold=0: 02:30 -> 03:30 EDT).
  A wall time that occurs twice (fall-back) resolves to the most recent
  occurrence that is not in the future (falling back to the first occurrence).
* Relative forms (``2h ago``, ``1d ago``) are exact elapsed time: ``1d ago`` is
  24h before now, which on a DST day is not the same wall-clock time.
* Comparisons/arithmetic are done in UTC: Python compares and subtracts two
  datetimes that share a tzinfo by their naive wall clock, which is wrong
  across a DST transition.
"""

from __future__ import annotations

import re
from datetime import date, datetime, timedelta, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

__all__ = ["TimeSpecError", "ACCEPTED_FORMS", "LAST_GOOD", "is_last_good", "parse_time", "host_now"]

# `--since last-good` names no time but a snapshot: the newest whose probe passed on the running
# stack (state/store.Store.last_good picks it). Parsed here, with every other --since form.
LAST_GOOD = "last-good"

ACCEPTED_FORMS = (
    "last-good (the newest snapshot whose probe passed), "
    "now, noon, midnight, today, yesterday, today HH:MM, yesterday HH:MM, HH:MM, "
    "N{s,m,h,d,w} ago (2h ago, 90m ago, 30 min ago, 1 hour ago, 2 days ago), "
    "ISO 8601 (2026-12-02T12:00, 2026-12-02T12:00Z, 2026-12-02T12:00+01:00, 2026-12-02), "
    "epoch seconds (1764676800, 1764676800.5)"
)


class TimeSpecError(ValueError):
    """A time spec could not be parsed, or names a time in the future.

    The message is a single line that quotes the input.
    """


_UTC = timezone.utc

_UNIT_SECONDS = {
    **dict.fromkeys(("s", "sec", "secs", "second", "seconds"), 1),
    **dict.fromkeys(("m", "min", "mins", "minute", "minutes"), 60),
    **dict.fromkeys(("h", "hr", "hrs", "hour", "hours"), 3600),
    **dict.fromkeys(("d", "day", "days"), 86400),
    **dict.fromkeys(("w", "wk", "wks", "week", "weeks"), 7 * 86400),
}

_NUM = r"(?:\d+(?:\.\d+)?|\.\d+|an?(?=\s))"
_REL_ATOM = rf"({_NUM})\s*([a-z]+)"
_REL_RE = re.compile(rf"(?:{_REL_ATOM}\s*)+ago")
_REL_ATOM_RE = re.compile(_REL_ATOM)
_HHMM = r"(\d{1,2}):(\d{2})(?::(\d{2}))?"
_HHMM_RE = re.compile(_HHMM)
_DAY_HHMM_RE = re.compile(rf"(today|yesterday)(?:\s+(?:at\s+)?{_HHMM})?")
_EPOCH_RE = re.compile(r"\d+(?:\.\d*)?|\.\d+")


def _bad(text: str, reason: str = "cannot parse time") -> TimeSpecError:
    return TimeSpecError(f"{reason} {text!r}; accepted: {ACCEPTED_FORMS}")


def _wall_candidates(
    d: date, h: int, m: int, s: int, tz: tzinfo, us: int = 0
) -> list[datetime]:
    """UTC instants at which the host wall clock reads ``d h:m:s`` (sorted).

    Two for an ambiguous (fall-back) time, one otherwise.  A non-existent
    (spring-forward) time yields zoneinfo's fold=0 resolution.
    """
    found: set[datetime] = set()
    for fold in (0, 1):
        local = datetime(d.year, d.month, d.day, h, m, s, us, tzinfo=tz, fold=fold)
        inst = local.astimezone(_UTC)
        back = inst.astimezone(tz)
        if back.replace(tzinfo=None, fold=0) == local.replace(tzinfo=None, fold=0):
            found.add(inst)
    if not found:  # in a gap: let zoneinfo resolve it (fold=0 -> shifted forward)
        found.add(datetime(d.year, d.month, d.day, h, m, s, us, tzinfo=tz).astimezone(_UTC))
    return sorted(found)


def _pick(cands: list[datetime], now_utc: datetime) -> datetime:
    """Most recent candidate that is not in the future, else the earliest one."""
    past = [c for c in cands if c <= now_utc]
    return past[-1] if past else cands[0]


def _check_hms(text: str, h: int, m: int, s: int) -> None:
    if not (0 <= h <= 23 and 0 <= m <= 59 and 0 <= s <= 59):
        raise _bad(text, "invalid time of day in")


def _most_recent(h: int, m: int, s: int, now: datetime, now_utc: datetime) -> datetime:
    """Today at h:m:s if that is not in the future, else yesterday at h:m:s."""
    tz = now.tzinfo
    today = now.date()
    inst = _pick(_wall_candidates(today, h, m, s, tz), now_utc)
    if inst > now_utc:
        inst = _pick(_wall_candidates(today - timedelta(days=1), h, m, s, tz), now_utc)
    return inst


def _parse_utc(text: str, norm: str, now: datetime, now_utc: datetime) -> datetime:
    tz = now.tzinfo

    if norm == "now":
        return now_utc
    if norm == "noon":
        return _most_recent(12, 0, 0, now, now_utc)
    if norm == "midnight":
        return _most_recent(0, 0, 0, now, now_utc)

    mt = _DAY_HHMM_RE.fullmatch(norm)
    if mt:
        day = now.date() - timedelta(days=1 if mt.group(1) == "yesterday" else 0)
        h, m, s = (int(g) if g else 0 for g in mt.group(2, 3, 4))
        _check_hms(text, h, m, s)
        return _pick(_wall_candidates(day, h, m, s, tz), now_utc)

    if _REL_RE.fullmatch(norm):
        total = 0.0
        for num, unit in _REL_ATOM_RE.findall(norm[: -len("ago")]):
            if unit not in _UNIT_SECONDS:
                raise _bad(text, f"unknown unit {unit!r} in")
            total += (1.0 if num in ("a", "an") else float(num)) * _UNIT_SECONDS[unit]
        try:
            return now_utc - timedelta(seconds=total)
        except OverflowError:
            raise _bad(text, "time out of range:") from None

    mt = _HHMM_RE.fullmatch(norm)
    if mt:
        h, m, s = (int(g) if g else 0 for g in mt.groups())
        _check_hms(text, h, m, s)
        return _most_recent(h, m, s, now, now_utc)

    if _EPOCH_RE.fullmatch(norm):
        try:
            return datetime.fromtimestamp(float(norm), _UTC)
        except (OverflowError, OSError, ValueError):
            raise _bad(text, "epoch seconds out of range:") from None

    iso = norm.upper()
    if iso.endswith("Z"):  # 3.10's fromisoformat does not take "Z"
        iso = iso[:-1] + "+00:00"
    try:
        parsed = datetime.fromisoformat(iso)
    except ValueError:
        raise _bad(text) from None
    if parsed.tzinfo is None:  # naive ISO = wall clock of the host
        p = parsed
        cands = _wall_candidates(p.date(), p.hour, p.minute, p.second, tz, p.microsecond)
        return _pick(cands, now_utc)
    return parsed.astimezone(_UTC)


def is_last_good(text: str | None) -> bool:
    """`--since last-good` (any case, `last_good` too): a snapshot, not a time."""
    return isinstance(text, str) and " ".join(text.split()).lower().replace("_", "-") == LAST_GOOD


def parse_time(text: str, now: datetime) -> datetime:
    """Parse ``text`` relative to the host's aware ``now``; result is aware in ``now``'s tz.

    Raises :class:`TimeSpecError` if ``text`` is not understood or is in the future.
    """
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("parse_time: now must be timezone-aware (the host's tz)")
    if not isinstance(text, str):
        raise _bad(str(text))
    norm = " ".join(text.split()).lower()
    if not norm:
        raise _bad(text, "empty time")
    if is_last_good(text):
        raise TimeSpecError(f"{text!r} names a snapshot, not a time: the caller picks it (Store.last_good)")
    now_utc = now.astimezone(_UTC)
    try:
        inst = _parse_utc(text, norm, now, now_utc)
        if inst > now_utc:
            shown = inst.astimezone(now.tzinfo).isoformat(timespec="seconds")
            raise TimeSpecError(
                f"time {text!r} is in the future ({shown}; host now is "
                f"{now.isoformat(timespec='seconds')})"
            )
        return inst.astimezone(now.tzinfo)
    except OverflowError:  # 0001-01-01 in a timezone east of UTC is before year 1
        raise _bad(text, "time out of range:") from None


def _zone(tz_name: str | None) -> ZoneInfo | None:
    if not tz_name:
        return None
    name = tz_name.strip().lstrip(":")  # TZ=":America/New_York" is valid POSIX
    if "zoneinfo/" in name:  # /usr/share/zoneinfo/Europe/Paris (readlink /etc/localtime)
        name = name.split("zoneinfo/", 1)[1]
    if not name or name.startswith("/"):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):
        return None


def host_now(epoch: float, tz_name: str | None, utc_offset_s: int) -> datetime:
    """The remote host's aware "now" from what it reports.

    Uses ``ZoneInfo(tz_name)`` when the name is valid here *and* agrees with the
    reported UTC offset at ``epoch`` (a mismatch means the name is wrong for that
    host, e.g. a stale TZ variable); otherwise a fixed-offset timezone.
    """
    zone = _zone(tz_name)
    if zone is not None:
        dt = datetime.fromtimestamp(epoch, zone)
        off = dt.utcoffset()
        if off is not None and round(off.total_seconds()) == int(utc_offset_s):
            return dt
    offset = timedelta(seconds=int(utc_offset_s))
    fixed = _UTC if not offset else timezone(offset)
    return datetime.fromtimestamp(epoch, fixed)
