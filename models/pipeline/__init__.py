"""The way a job goes: ``door`` (the one door every way in calls: a Submission, ``admit``),
``intake`` (a job admitted: its audio stored, its row written, its message published), and the
worker stages, job by job: ``preparation`` (claim, fetch, decode, split into windows) and
``inference`` (windows through the batcher and the engine, the result stored once), with
``messages``, the typed, versioned message the first hands the second; ``options``, a job's
options as the door checks them (the API, ``transcribe.delay()``); ``shadowing``, a job's
second decoding by a shadow model.

Where a job meets speech and the served models: may import every package below it (speech,
registry, jobs, access, delivery); never maintenance or runtime. Celery's tasks in ``tasks/``
call these and hold no logic of their own."""
