"""The worker stages, job by job: ``preparation`` (claim, fetch, decode, split into windows)
and ``inference`` (windows through the batcher and the engine, the result stored once), and
``messages``, the typed, versioned message the first hands the second; ``options``, a job's
options as every door checks them (the API, ``transcribe.delay()``).

The one place jobs meet speech: may import every package below it (speech, jobs, access,
delivery). Celery's tasks in ``tasks/`` call these and hold no logic of their own."""
