"""The model registry at run time: which models a deployment serves, the weights each runs now,
and each one's engine, loaded.

- ``catalog`` - each served model's weights on disk (the bundled ones assembled and checked),
  their version (the weights' SHA-256), its languages, and the lookups a job's model goes
  through (a name, an alias's variants, the default).
- ``swaps`` - hot swaps and rollbacks of a model's weights: the ``model_weights`` table, and
  what each worker takes up from it (``ActiveWeights``).
- ``loader`` - a served model's engine (``models.speech``), loaded from the weights in force.

Parsing the configuration (WHISPERQ_MODELS, WHISPERQ_DEFAULT_MODEL, aliases and shadows into
``ModelSpec`` and ``Routes``) is ``config.registry``: pure, importing nothing of ``models``.

May import config, the foundation (``models.errors``, ``models.db``), ``models.security`` and
``models.speech``; never ``models.jobs`` or anything above it."""
