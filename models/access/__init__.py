"""Who may ask and how much: API keys, tiers and their webhook secrets (``apikeys``), the
queue budget and disk floor with a time to come back (``admission``; the one door that applies
them to every way in is models.pipeline.door), what each key used (``usage``), its monthly
audio quota (``quotas``), both together as the usage report a key is billed by (``billing``), and
which S3 objects an ``audio_url=s3://…`` of a key may name (``s3_sources``).

May import config, the foundation, ``models.security`` and ``models.jobs``."""
