"""Billing: the usage report, what each key was billed for per UTC day over a range of days
(models.access.usage says what counts), with this month's quota standing (models.access.quotas),
as `GET /v1/usage` and `whisperq keys usage` show it."""

from __future__ import annotations

from datetime import date, datetime
from typing import TYPE_CHECKING, Any

from sqlalchemy import select

from models.access.apikeys import ApiKey
from models.access.quotas import quota_of, standing
from models.access.usage import ALL, Figures, day_range, figures
from models.jobs.record import utcnow

if TYPE_CHECKING:
    from models.runtime import Runtime


def usage_report(
    rt: Runtime, first: date, last: date, owner: object = ALL, now: datetime | None = None
) -> dict[str, Any]:
    """GET /v1/usage and `whisperq keys usage`: per key, its days with jobs (oldest first), its
    total over the range, and this month's quota standing where its tier has a quota. With
    ALL: every key that is not revoked, and every key (or no key) with jobs in the range.
    `owner`: one key id (None: the jobs without a key), or ALL."""
    if owner is not ALL and not isinstance(owner, (str, type(None))):
        raise TypeError(f"owner is a key id, None (the jobs without a key) or ALL, not {owner!r}")
    now = now or utcnow()
    start, end = day_range(first, last)
    found = figures(rt, start, end, owner=owner)
    with rt.db.session() as session:
        query = select(ApiKey)
        if owner is not ALL:
            query = query.where(ApiKey.id == owner)
        keys: dict[str | None, tuple[str, str | None, datetime | None]] = {
            k.id: (k.name, k.tier, k.revoked_at) for k in session.scalars(query).all()
        }
    owners = {key for key, _ in found}
    if isinstance(owner, (str, type(None))):  # one key (or the jobs without one), not ALL
        owners.add(owner)
    else:
        owners |= {key for key, (_, _, revoked) in keys.items() if revoked is None}
    entries: list[dict[str, Any]] = []
    for key in owners:
        name, tier, revoked = keys.get(key, ("anonymous" if key is None else "(unknown key)", None, None))
        days = sorted(((_day(when), f) for (k, when), f in found.items() if k == key), key=lambda d: d[0])
        total = Figures()
        for _, f in days:
            total += f
        quota = quota_of(rt, key, tier=tier) if key is not None and tier is not None else None
        entries.append(
            {
                "key_id": key,
                "name": name,
                "tier": tier,
                "revoked": revoked is not None,
                "total": total.to_dict(),
                "days": [dict(date=when, **f.to_dict()) for when, f in days],
                "quota": standing(rt, key, quota, now).to_dict() if quota else None,
            }
        )
    entries.sort(key=lambda e: (e["key_id"] is not None, e["name"], e["key_id"] or ""))
    return {"from": first.isoformat(), "to": last.isoformat(), "keys": entries}


def _day(when: str | None) -> str:
    """A day of figures(..., by_day=True), which names every row's day."""
    if when is None:
        raise RuntimeError("usage figures by day came without their day")
    return when
