"""Shadow decoding in the inference pool: a job's samples decoded again by a candidate model.

The preparation pool gives a job marked for shadow (config.registry.Routes) a second copy of
its samples and, beside the job's own inference message, sends one to the candidate's queue
(``whisperq.shadow``). Here the candidate transcribes that copy at low priority, the
transcript is stored apart (models.jobs.shadows), and the copy is deleted. The job never
waits for it and is never changed by it; a shadow that fails is logged and dropped, never
retried: it measures, it does not serve.
"""

from __future__ import annotations

import logging
from dataclasses import replace
from typing import TYPE_CHECKING, Any, cast

from models.jobs.shadows import ShadowResult, record_shadow
from models.pipeline.inference import window_languages
from models.pipeline.messages import Prepared
from models.speech.segments import Transcript

if TYPE_CHECKING:
    from models.runtime import Runtime

log = logging.getLogger(__name__)


def shadow_message(prepared: Prepared) -> Prepared:
    """The candidate's message: its model, its copy of the samples."""
    # a job with a shadow has its copy's reference
    return replace(
        prepared, model=prepared.shadow, samples_ref=cast(str, prepared.shadow_ref), shadow=None, shadow_ref=None
    )


def shadow_job(rt: Runtime, message: Prepared) -> ShadowResult | None:
    """Transcribe the copy with the candidate and keep the transcript apart; never raises
    for the job's sake (the caller logs what it does raise)."""
    try:
        engine = rt.engine_for(message.model)
        samples = rt.storage.load_samples(message.samples_ref)
        chunks = [(w.samples(samples), w.time_map()) for w in message.windows]
        languages, _sureness = window_languages(engine, [c[0] for c in chunks], message.language)
        batcher = rt.batcher_for(message.model)
        futures: list[Any] = [None] * len(chunks)  # each filled below: a Future per window
        for lang in dict.fromkeys(languages):
            mine = [n for n, found in enumerate(languages) if found == lang]
            submitted = batcher.submit(
                (lang, *message.decoding, engine), [chunks[n] for n in mine], priority="low", job_id=message.job_id
            )
            for n, future in zip(mine, submitted, strict=True):
                futures[n] = future
        limit = rt.settings.time_limit(message.duration)
        segments = [s for future in futures for s in future.result(timeout=limit)]
        text = Transcript.from_segments(segments, languages[0] if languages else "en", message.duration).text
        model = cast(str, message.model)  # shadow_message names the candidate
        row = record_shadow(rt, message.job_id, model, getattr(engine, "version", None), text)
        if row is not None:
            log.info(
                "job %s: shadow transcript by %s stored%s",
                message.job_id,
                message.model,
                f" (WER against the primary {row.wer:.3f})" if row.wer is not None else "",
            )
        return row
    finally:
        rt.storage.delete(message.samples_ref)
