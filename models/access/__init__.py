"""Who may ask and how much: API keys, tiers and their webhook secrets (``apikeys``), the
front door's refusals with a time to come back (``admission``), what each key used
(``usage``), its monthly audio quota (``quotas``) and both as a statement (``statements``).

May import config, the foundation, ``models.security`` and ``models.jobs``."""
