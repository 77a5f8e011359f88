"""Speech: audio in, transcript out, with no idea of jobs, queues or the database.

- ``audio`` - probing and decoding (PyAV), confined to the file's own bytes.
- ``windows`` - speech split into windows of at most 30 s; ``segments`` - a transcript's shape.
- ``engines`` - faster-whisper behind one interface; ``openai_engine`` and ``convert`` - the
  openai-whisper engine and the checkpoint it loads; ``catalog`` - each served model's
  weights, version and languages; ``loader`` - a model's engine, loaded.
- ``batching`` - the dynamic batcher across jobs; ``formats`` - text, JSON, SRT, WebVTT.

May import config, the foundation (``models.errors``) and ``models.security``; never
``models.jobs`` or anything above it. Running a job's windows through an engine is
``models.pipeline.inference``."""
