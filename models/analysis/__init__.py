"""Analyses that run after a job's transcript is stored, each as its own task on the `analysis`
queue (tasks.analysis): who spoke (speakers), what to hide (redact). Adding one is a module
with the contract of models.analysis.base and one entry in REGISTRY.

A job asks for them by name at any door (`speakers=true`, `redact=pii`); the door checks each
value with the module's `parse` and refuses one that is not installed here, saying how to add
it. The job is COMPLETED when its transcript and every analysis it asked for are done (an
analysis that fails for good leaves the transcript delivered, and says why). Running them and
storing their outputs is ``models.jobs.analyses``.

May import config, the foundation (``models.errors``) and ``models.speech``; never the database,
jobs or anything above them: an analysis sees a transcript (and its audio), nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib import import_module
from typing import Any, cast

from models.analysis.base import Analysis
from models.errors import InvalidRequest

# name -> module, in the order their results are merged into the transcript: redaction first
# (it replaces text in place), then speakers (which split segments where the voice changes).
MODULES = {"redact": "models.analysis.redaction", "speakers": "models.analysis.speakers"}


def analysis(name: str) -> Analysis:
    """The module of a registered analysis."""
    if name not in MODULES:
        raise InvalidRequest(f"unknown analysis {name!r}; the analyses are {', '.join(MODULES)}")
    return cast("Analysis", import_module(MODULES[name]))


def hides(names: Mapping[str, Any] | None) -> list[str]:
    """Those of `names` (a job's analyses) that hide what the transcript said (redaction)."""
    return [name for name in MODULES if name in (names or {}) and analysis(name).HIDES]


def requested(form: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The analyses a submission's fields ask for, name -> parameters, each value checked by its
    module; one not installed on this deployment is refused with what to install."""
    out: dict[str, dict[str, Any]] = {}
    for name in MODULES:
        if name not in form:
            continue
        module = analysis(name)
        params = module.parse(form[name])
        if params is None:
            continue
        missing = module.missing()
        if missing is not None:
            raise InvalidRequest(f"{name} is not installed on this deployment: {missing}")
        out[name] = params
    return out


def merged(result: dict[str, Any], runs: Mapping[str, tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """The transcript with each finished analysis applied, in registry order: `runs` maps a
    name to its (params, output)."""
    for name in MODULES:
        if name in runs:
            params, output = runs[name]
            result = analysis(name).apply(result, output, params)
    return result
