"""`GET /v1/usage`: audio seconds and jobs per UTC day, of the calling key (an admin: of any
key, or of all), with this month's quota standing (models.access.usage, models.access.quotas)."""

from __future__ import annotations

import re
from datetime import date

from flask import current_app, jsonify, request

from models.access.apikeys import KeyNotFound, find_key
from models.access.billing import usage_report
from models.access.usage import ALL
from models.errors import InvalidRequest, WhisperqError
from models.jobs.record import utcnow

from .auth import current

_DAY = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}")


def parse_day(value: str | None, name: str, default: date) -> date:
    if value is None:
        return default
    try:
        if not _DAY.fullmatch(value):
            raise ValueError(value)
        return date.fromisoformat(value)
    except ValueError:
        raise InvalidRequest(f"{name} must be a UTC day as YYYY-MM-DD, such as 2026-11-01, not {value!r}") from None


def days_asked(args, today: date) -> tuple[date, date]:
    """`from` and `to` (both included); by default this month up to today."""
    first = parse_day(args.get("from"), "from", today.replace(day=1))
    return first, parse_day(args.get("to"), "to", max(today, first))


def usage():
    rt = current_app.extensions["whisperq"]
    who = current()
    first, last = days_asked(request.args, utcnow().date())
    asked = request.args.get("key")
    if asked:
        try:
            found = find_key(rt, asked).id
        except (KeyNotFound, WhisperqError):
            found = None
        if found is None or (not who.admin and found != who.owner):
            # Another key's usage is not found, exactly as a key that never was.
            raise KeyNotFound(
                f"no API key with id or prefix {asked!r}"
                + ("; see `whisperq keys list`" if who.admin else "; a key sees its own usage only")
            )
        owner: object = found  # a key id, None (the jobs without a key) or ALL
    else:
        owner = ALL if who.admin else who.owner
    return jsonify(usage_report(rt, first, last, owner=owner))
