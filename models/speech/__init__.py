"""Speech: audio in, transcript out, with no idea of jobs, queues or the database.

- ``audio`` - probing and decoding (PyAV), confined to the file's own bytes.
- ``windows`` - speech split into windows of at most 30 s; ``segments`` - a transcript's shape.
- ``engines`` - faster-whisper behind one interface; ``openai_engine`` and ``convert`` - the
  openai-whisper engine and the checkpoint it loads.
- ``batching`` - the dynamic batcher across jobs; ``formats`` - text, JSON, SRT, WebVTT.

May import config, the foundation (``models.errors``) and ``models.security``; never
``models.db``, ``models.registry``, ``models.jobs`` or anything above them. Which models are
served, their weights and versions, and loading one's engine is ``models.registry``; running a
job's windows through an engine is ``models.pipeline.inference``."""
