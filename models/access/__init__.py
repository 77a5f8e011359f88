"""Who may ask and how much: API keys, tiers and their webhook secrets (``apikeys``), and the
front door's refusals with a time to come back (``admission``).

May import config, the foundation, ``models.security`` and ``models.jobs``."""
