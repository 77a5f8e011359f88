"""The one door: how every job gets into the pipeline, whichever way it came in.

Every way in — the upload form, `POST /v1/jobs` (a file or an `audio_url`), `POST /v1/batches`,
the OpenAI endpoint, re-runs, `transcribe.delay()`, MQTT, and a raw broker message taken by the
preparation pool — turns what it got into a `Submission` (who, what audio, which options,
which door) and calls `submit` (or `admit`, then `accept`). The rules live here, once:

1. **Who.** The principal is built here (`identify`) from the key itself (a bearer key, a
   signed-in session, the key an operator mapped an MQTT client to, `api_key=`, or an owner
   token this service issued and sealed): never from a key id a caller names. A revoked key is
   refused; without a key, the one anonymous principal where WHISPERQ_ALLOW_ANONYMOUS allows
   it, at every way in (`transcribe.delay()` and raw messages too).
   Before any body is read (`gate`): the caller's rate, the disk floor, the queue past even
   the high-priority budget and a spent quota, skipped for a retry under an idempotency key
   seen lately (its job is answered from the record).
2. **What.** The options (models.pipeline.options), the model served, the tier's priority cap.
3. **The audio.** An upload is sealed and measured by its header against its tier's length
   limit; a URL goes through the address guard, an `s3://` one through the key's S3 sources
   (models.access.s3_sources: never the service's own storage) and S3's word that the object is
   there and within the upload limit; a path must lie in one of the owner's own
   input directories (WHISPERQ_INPUT_DIRS, `KEY=DIR` for a key's own), resolved, in no other
   tenant's directory, and is opened later without following links (models.storage.spool).
4. **Idempotency.** Keys are scoped to the owner and to the door's namespace (a client's
   `Idempotency-Key` can never name an MQTT request's key, nor another owner's), and a hit is
   checked against the owner before it is answered.
5. **How much.** The key's monthly quota and the queue budget and key share, on the audio's
   length (a batch counted whole).
6. **The key's defaults.** `collect` from the key where the job did not say.

models.pipeline.intake then records what the door admitted (`submit` is both steps): it stores
the audio with its PENDING row, checks the quota again with the row in, remembers the
idempotency key and publishes through the runtime's broker (one seam, implemented in tasks/).
A refusal at any step leaves nothing stored and nothing queued.

Preparation runs the same `admit` for a message that names no job it knows (a raw producer,
or `transcribe.delay()`), and checks every job's decoded length against its tier's limit, its
quota and its key's share (models.pipeline.preparation): a header that lied gains nothing.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from models.access import quotas
from models.access.admission import Backlog, check_disk, check_queue, check_rate
from models.access.apikeys import (
    PREFIX,
    Principal,
    authenticate,
    key_collects,
    key_hotwords,
    principal_for_key_id,
)
from models.access.s3_sources import check_source, is_s3_url, parse_s3_url
from models.errors import Forbidden, IdempotencyConflict, InvalidRequest, Unauthorized
from models.jobs import idempotency
from models.jobs.operations import get_job
from models.jobs.record import Job, JobOptions
from models.pipeline.options import check_served, parse_options
from models.pipeline.request import DOORS
from models.security.crypto import DecryptionError, decrypt_value, seal_value, value_is_bound
from models.speech import audio as audio_io
from models.storage import SealedSpool, caller_file, open_caller_file

if TYPE_CHECKING:
    from config import Settings
    from models.runtime import Runtime

# Where a job came in (jobs.origin): models.pipeline.request.DOORS. A job from
# transcribe.delay() keeps its transcript in the result backend too, for r.get(); every other
# job keeps it in its row only.
KEEPS_RESULT = ("delay",)


@dataclass(frozen=True)
class Submission:
    """One job as a way in received it. Exactly one of `upload`, `audio_url`, `path` names its
    audio (a re-run names the job whose audio it copies, `rerun_of`)."""

    who: Principal
    door: str
    fields: Mapping[str, Any] = field(default_factory=dict)  # the options as sent: strings or JSON values
    upload: SealedSpool | None = None  # an uploaded file, sealed in this host's tmp/
    filename: str | None = None
    audio_url: str | None = None
    path: str | None = None
    rerun_of: Job | None = None
    idempotency_key: str | None = None  # as the client sent it; scoped to the owner here
    default_priority: str | None = None  # the door's, else the principal's
    job_id: str | None = None  # set by a producer that chose it (transcribe.delay(), a raw message)

    def __post_init__(self) -> None:
        if self.door not in DOORS:
            raise ValueError(f"unknown door {self.door!r}")
        given = [x for x in (self.upload, self.audio_url, self.path, self.rerun_of) if x is not None]
        if len(given) > 1:
            raise ValueError("a submission names one audio: an upload, an audio_url, a path or a job to re-run")


@dataclass(frozen=True)
class Admission:
    """A submission that passed every rule: what `accept` records."""

    submission: Submission
    options: JobOptions
    seconds: float | None  # the audio's length by its header; None until a URL is fetched
    audio_format: str | None = None
    path: str | None = None  # a caller's file, resolved
    audio_url: str | None = None  # as the address guard passed it
    idempotency_key: str | None = None  # scoped
    fingerprint: str | None = None
    earlier: Job | None = None  # the job made before under the same idempotency key

    @property
    def owner(self) -> str | None:
        return self.submission.rerun_of.owner if self.submission.rerun_of is not None else self.submission.who.owner

    @property
    def priority(self) -> str:
        return self.options.priority


# -- who ---------------------------------------------------------------------------------------

ADMIN = Principal(owner=None, tier="premium", admin=True, name="admin token")


def anonymous(settings: Settings) -> Principal:
    """The one anonymous principal, whichever way it came in: no owner, no tier, and at most
    WHISPERQ_ANONYMOUS_MAX_PRIORITY."""
    return Principal(owner=None, tier=None, cap=settings.anonymous_max_priority)


def matches(token: str, secret: str | None) -> bool:
    """Whether a token is this secret (compared in constant time)."""
    if not secret:
        return False
    return hmac.compare_digest(token.encode(), secret.encode())


def identify(
    rt: Runtime,
    *,
    token: str | None = None,
    key_id: str | None = None,
    how: str,
    what: str = "this request",
    lookup: Callable[[Runtime, str], Principal] | None = None,
) -> Principal:
    """Who a submission acts for, decided the same way at every way in.

    - `token`, the key itself (HTTP's bearer, gRPC's metadata, `transcribe.delay(api_key=...)`,
      a raw message's `api_key`): WHISPERQ_ADMIN_TOKEN is an admin; where anonymous use is
      allowed, a token that is no whisperq key is no claim to be anyone (OpenAI's SDKs must send
      one); otherwise the key, verified (`lookup`, by default models.access.apikeys.authenticate):
      an unknown or revoked one is Unauthorized, even where anonymous use is allowed.
    - `key_id`, a key this deployment vouched for (an operator's MQTT client map, an owner
      token it sealed, a signed-in session): the key, checked now; Forbidden once revoked.
    - neither: the one anonymous principal where WHISPERQ_ALLOW_ANONYMOUS is on, else
      Unauthorized, saying `how` to send a key.
    """
    if token is not None:
        if not isinstance(token, str):
            raise InvalidRequest("the API key must be given as a string (wq_...)")
        if matches(token, rt.settings.admin_token):
            return ADMIN
        if rt.settings.allow_anonymous and not token.startswith(PREFIX):
            return anonymous(rt.settings)
        return (lookup or authenticate)(rt, token)
    if key_id is not None:
        return principal_of_key_id(rt, key_id, what)
    if rt.settings.allow_anonymous:
        return anonymous(rt.settings)
    raise Unauthorized(f"this server needs an API key: {how} (an operator creates one with `whisperq keys create`)")


def principal_of_key_id(rt: Runtime, key_id: str, what: str) -> Principal:
    """An operator-configured key (an MQTT client's, a sealed owner token's), checked now:
    Forbidden once it is revoked."""
    found = principal_for_key_id(rt, key_id)
    if found is None:
        raise Forbidden(f"the API key of {what} was revoked or removed; an operator names another")
    return found


_OWNER_TOKEN = "owner-token:"


def owner_token(job_id: str, owner: str) -> str:
    """A token that says this service let `job_id` be submitted for the key `owner`: sealed with
    the deployment's keys, bound to the job id, so it names no other job and no other key."""
    return seal_value(owner, _OWNER_TOKEN + job_id)


def owner_from_token(job_id: str, token: object) -> str:
    """The key id an owner token was issued for; InvalidRequest when it was not issued for
    this job by this deployment."""
    if not isinstance(token, str):
        raise InvalidRequest("owner_token must be the string transcribe.delay() sent")
    if not value_is_bound(token):  # sealed for no place at all: it would name any job
        raise InvalidRequest(
            "owner_token was not issued by this deployment for this job id; submit with "
            "transcribe.delay(api_key=...) or give the message's api_key"
        )
    try:
        return decrypt_value(token, place=_OWNER_TOKEN + job_id)
    except (DecryptionError, ValueError):
        raise InvalidRequest(
            "owner_token was not issued by this deployment for this job id; submit with "
            "transcribe.delay(api_key=...) or give the message's api_key"
        ) from None


# -- the rules ---------------------------------------------------------------------------------


def client_bucket(who: Principal, address: str) -> str:
    """Whose rate a request counts against: its key's, else its address's (a bearer that is no
    key earns no bucket of its own: a new random one per request would be a fresh limit)."""
    return "key:" + who.owner if who.owner is not None else "addr:" + address


def gate(
    rt: Runtime, who: Principal, address: str, namespace: str, idempotency_key: str | None = None
) -> dict[str, str]:
    """What is refused before any body is read, the same at every way in (HTTP, gRPC, MQTT):
    the caller's rate (by key, else `address`), the disk floor, the queue past even the
    high-priority budget, and a key whose monthly quota is spent. A retry under an
    idempotency key this door saw lately passes (`admit` answers it with its job, whatever the
    queue holds now). Returns the rate limit's headers, for a way in that shows them."""
    key = scoped_key(who, namespace, idempotency_key)
    if key is not None and seen(rt, key):
        return {}
    headers = check_rate(rt.settings, who.tier, client_bucket(who, address))
    check_disk(rt)
    check_queue(rt, "high")
    if who.owner is not None:
        quotas.check(rt, who.owner, tier=who.tier)
    return headers


def input_dirs_of(rt: Runtime, owner: str | None, admin: bool = False) -> tuple[tuple[Path, ...], tuple[Path, ...]]:
    """The input directories a key may name files in (its own, WHISPERQ_INPUT_DIRS `KEY=DIR`,
    and the shared ones; an admin, every one), and those that are other keys' own."""

    def mine(grant: str | None) -> bool:
        return admin or grant is None or (owner is not None and (owner == grant or owner.startswith(grant)))

    grants = rt.settings.input_grants
    return tuple(d for who, d in grants if mine(who)), tuple(d for who, d in grants if not mine(who))


def resolve_path(rt: Runtime, path: str, owner: str | None, admin: bool = False) -> str:
    """A caller's file, resolved, if `owner` may name it (ValueError saying what to do)."""
    mine, theirs = input_dirs_of(rt, owner, admin)
    return caller_file(path, mine, rt.settings.data_dir, theirs)


def scoped_key(who: Principal, namespace: str, key: str | None) -> str | None:
    """An idempotency key as stored: the owner's and the door's, so that no caller can reach
    another owner's job, nor an MQTT request's, by sending the same string."""
    if key is None:
        return None
    if not 1 <= len(key) <= idempotency.MAX_KEY_LENGTH or not key.isascii() or not key.isprintable():
        raise InvalidRequest(f"Idempotency-Key must be 1 to {idempotency.MAX_KEY_LENGTH} printable ASCII characters")
    return "i:" + hashlib.sha256(json.dumps([namespace, who.owner, key]).encode()).hexdigest()


def _options(rt: Runtime, sub: Submission) -> JobOptions:
    options = parse_options(sub.fields, rt.settings, sub.default_priority or sub.who.default_priority())
    if options.model is not None and options.model != rt.settings.default_model:
        check_served(rt, options.model)
    sub.who.check_priority(options.priority)
    said = sub.fields.get("collect")
    if said is None or (isinstance(said, str) and not said.strip()):  # not said: the key's choice
        owner = sub.rerun_of.owner if sub.rerun_of is not None else sub.who.owner
        options = replace(options, collect=key_collects(rt, owner))
    if options.hotwords is None:  # none given: the key's own list, if it has one
        owner = sub.rerun_of.owner if sub.rerun_of is not None else sub.who.owner
        options = replace(options, hotwords=key_hotwords(rt, owner))
    return options


def _path(rt: Runtime, sub: Submission, local: bool = True) -> str:
    """The caller's file, resolved, inside its owner's input directories. A file in another
    key's directory gets the answer a path outside every directory gets, whether it exists
    or not: a refusal tells nothing of other tenants' files."""
    given = sub.path.strip() if isinstance(sub.path, str) else None
    listed = ", ".join(str(d) for d in input_dirs_of(rt, sub.who.owner, sub.who.admin)[0]) or (
        "none: an operator gives this key its own with WHISPERQ_INPUT_DIRS"
    )
    if not given or not os.path.isabs(given):
        raise InvalidRequest(
            f"path must be the absolute path of an audio file in your input directories ({listed}), "
            "as the service's workers see it"
        )
    try:
        path = resolve_path(rt, given, sub.who.owner, sub.who.admin)
    except ValueError as exc:
        raise InvalidRequest(str(exc)) from None
    if local and (not os.path.isfile(path) or not os.access(path, os.R_OK)):
        raise InvalidRequest(
            f"there is no file the service can read at path {given!r} in your input directories "
            f"({listed}); check the path and that the file is readable by the service"
        )
    return path


def _fingerprint(sub: Submission, options: JobOptions, what: Any) -> str:
    if sub.upload is not None:
        digest = sub.upload.sha256.copy()
        digest.update(json.dumps([sub.filename, options.fields()], sort_keys=True).encode())
        return digest.hexdigest()
    return hashlib.sha256(json.dumps([what, options.fields()], sort_keys=True).encode()).hexdigest()


def idempotent_hit(rt: Runtime, who: Principal, key: str | None, fingerprint: str) -> str | None:
    """The id recorded earlier under this (scoped) key, if any; refused when it is not the
    owner's (it cannot be, with scoped keys: a guard should they ever collide)."""
    if key is None:
        return None
    return idempotency.lookup(rt, key, fingerprint)


def earlier_job(rt: Runtime, who: Principal, job_id: str) -> Job:
    job = get_job(rt, job_id)
    if job.owner != who.owner and not who.admin:
        raise IdempotencyConflict("this Idempotency-Key was used by another client; use a new key")
    return job


def admit(
    rt: Runtime,
    sub: Submission,
    *,
    namespace: str | None = None,
    queue: bool = True,
    quota: bool = True,
    local: bool = True,
) -> Admission:
    """Check `sub` against every rule, in the order that refuses cheapest first; an upload is
    measured by its header. Returns the Admission (with `earlier` set when the idempotency
    key names a job made before: nothing more was checked, nothing is to be made).
    `queue=False`, `quota=False`: the queue budget and the quota are checked by the caller
    (a batch, all of its jobs at once: `check_share`) or were (a message already queued).
    `local=False`: a path is checked for whose it is, but it may not be readable here
    (transcribe.delay() from another host): measured where it is, else by the workers."""
    if sub.upload is None and sub.audio_url is None and sub.path is None and sub.rerun_of is None:
        raise InvalidRequest("no audio: send a file, an audio_url or a path")
    options = _options(rt, sub)
    key = scoped_key(sub.who, namespace or sub.door, sub.idempotency_key)
    path = _path(rt, sub, local) if sub.path is not None else None
    url, source = sub.audio_url, None
    if url is not None:
        from models.delivery.outbound import check_url

        if not isinstance(url, str) or not url.strip():
            raise InvalidRequest("audio_url must be the http(s) or s3:// URL of the audio, as a string")
        if is_s3_url(url):
            source = check_source(rt, parse_s3_url(url), sub.who.owner)
            url = source.url
        else:
            url = check_url(url.strip(), rt.settings, "audio_url")
    fingerprint = _fingerprint(sub, options, url or path or (sub.rerun_of.id if sub.rerun_of else None))
    earlier = idempotent_hit(rt, sub.who, key, fingerprint)
    if earlier is not None:
        return Admission(
            sub, options, None, idempotency_key=key, fingerprint=fingerprint, earlier=earlier_job(rt, sub.who, earlier)
        )
    if source is not None:
        from models.delivery.s3_fetch import probe

        probe(rt, source)  # there, readable by the deployment, within the upload limit
    seconds, fmt = None, None
    limit = rt.settings.audio_limit(sub.who.tier)
    if sub.upload is not None:
        with sub.upload.open() as fh:
            info = audio_io.probe(fh, max_seconds=limit)
        seconds, fmt = info.duration, info.format
    elif path is not None and local:
        try:
            with open_caller_file(path) as fh:
                info = audio_io.probe(fh, max_seconds=limit)
        except OSError as exc:
            raise InvalidRequest(
                f"the file at path {path!r} could not be read ({exc.strerror or exc}); check that "
                "it is readable by the service"
            ) from None
        seconds, fmt = info.duration, info.format
    elif path is not None:  # measured here where it can be; what it holds is for the workers to say
        seconds = _length_if_readable(path, limit)
    elif sub.rerun_of is not None:
        seconds, fmt = sub.rerun_of.audio_duration, sub.rerun_of.audio_format
    owner = sub.rerun_of.owner if sub.rerun_of is not None else sub.who.owner
    counted = seconds if seconds is not None else rt.settings.unfetched_audio_seconds
    if queue:
        check_queue(rt, options.priority, owner=owner)
    if quota:
        quotas.check(rt, owner, counted, tier=sub.who.tier if sub.rerun_of is None else None)
    return Admission(sub, options, seconds, fmt, path, url, key, fingerprint)


def _length_if_readable(path: str, limit: float) -> float | None:
    try:
        with open_caller_file(path) as fh:
            return audio_io.probe(fh, max_seconds=limit).duration
    except Exception:  # unreadable here, not audio, too long: the preparation pool fails it, saying why
        return None


def check_batch_size(rt: Runtime, count: int, what: str = "items") -> None:
    """A batch holds 1 to WHISPERQ_MAX_BATCH_ITEMS jobs, whichever way it came in; the message
    says how to send it (`what`: the batch's items as the way in names them)."""
    limit = rt.settings.max_batch_items
    if count < 1:
        raise InvalidRequest(f"the batch is empty: give it 1 to {limit} {what} (WHISPERQ_MAX_BATCH_ITEMS)")
    if count > limit:
        raise InvalidRequest(
            f"the batch has {count} {what}; at most {limit} go in one batch (WHISPERQ_MAX_BATCH_ITEMS): split it "
            "in several"
        )


def check_share(rt: Runtime, who: Principal, priority: str, seconds: list[float]) -> None:
    """A batch of jobs of `seconds` each (a URL's at WHISPERQ_URL_AUDIO_ESTIMATE_SECONDS until
    fetched): the queue budget and the key's share and quota with all of them counted. The
    whole batch gets in, or none of it: where its jobs sent one after another, the longest
    last, would all have got in."""
    ahead = Backlog(len(seconds) - 1, sum(seconds) - max(seconds))
    check_queue(rt, priority, owner=who.owner, ahead=ahead)
    quotas.check(rt, who.owner, sum(seconds), tier=who.tier)


def seen(rt: Runtime, key: str | None) -> bool:
    """Whether a request came under this (scoped) idempotency key lately."""
    return idempotency.seen(rt, key)


def keeps_result(job: Job | None) -> bool:
    """Whether a task may return `job`'s transcript to the result backend: only a
    transcribe.delay() caller's job, whose caller reads it with r.get()."""
    return job is not None and job.origin in KEEPS_RESULT


__all__ = [
    "DOORS",
    "Admission",
    "Submission",
    "admit",
    "check_batch_size",
    "check_share",
    "client_bucket",
    "earlier_job",
    "gate",
    "idempotent_hit",
    "identify",
    "input_dirs_of",
    "keeps_result",
    "owner_from_token",
    "owner_token",
    "principal_of_key_id",
    "resolve_path",
    "scoped_key",
    "seen",
]
