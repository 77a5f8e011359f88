"""What an analysis is: one module, registered once in models.analysis.

An analysis runs after a job's transcript is stored, as its own task on the `analysis` queue
(tasks.analysis), and fails or succeeds on its own. Its module gives:

- ``NAME``: the option that asks for it at every door (form, JSON, batches, `delay()`, MQTT,
  the OpenAI endpoint, gRPC), and its key under the result's ``analyses``;
- ``VERSION``: recorded with its output, so a result says which version made it;
- ``NEEDS_AUDIO``: whether ``run`` gets the prepared samples (16 kHz mono float32);
- ``HIDES``: whether it hides what the transcript said (redaction). Such an analysis runs
  where the transcript is stored, before it is (models.jobs.analyses.hide_before_storing), a
  partial one too: the words it hides are kept nowhere, and where it fails the job keeps no
  text at all; a job that asks for it is never shadowed and never exported for training;
- ``EXTRA``: the pip extra that installs what it needs (None: always installed);
- ``missing()``: None when it can run here, else what to install (a sentence for the client);
- ``parse(value)``: the option as a door received it (a string from a form, a JSON value) ->
  its parameters (a JSON-able dict), or None where the value means "not asked". A bad value
  raises models.errors.InvalidRequest saying what to send;
- ``run(result, params, samples)``: its output (JSON-able) from the stored transcript;
- ``apply(result, output, params)``: the transcript as the job's clients get it, with this
  analysis merged (speakers label segments and words; redaction replaces what it hides);
- ``given(params)``: the option's value that parses back to `params` (what a re-run sends).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np


class Analysis(Protocol):
    NAME: str
    VERSION: str
    NEEDS_AUDIO: bool
    HIDES: bool
    EXTRA: str | None

    def missing(self) -> str | None: ...

    def parse(self, value: Any) -> dict[str, Any] | None: ...

    def run(self, result: dict[str, Any], params: dict[str, Any], samples: np.ndarray | None) -> dict[str, Any]: ...

    def apply(self, result: dict[str, Any], output: dict[str, Any], params: dict[str, Any]) -> dict[str, Any]: ...

    def given(self, params: dict[str, Any]) -> Any: ...
