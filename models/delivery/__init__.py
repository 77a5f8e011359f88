"""Talking to the client's servers: outbound HTTP under the address guard (``outbound``),
signed webhooks (``webhooks``), the outbox that turns a job's state change into exactly one
delivery (``notify``), and fetching audio by URL (``fetch``).

May import config, the foundation, ``models.security``, ``models.jobs`` and ``models.access``."""
