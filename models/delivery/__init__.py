"""Talking to the client's servers: outbound HTTP under the address guard (``outbound``),
signed webhooks (``webhooks``), the outbox that turns a job's state change into exactly one
delivery (``notify``), fetching audio by URL (``fetch``; an ``s3://`` one with the deployment's
credentials: ``s3_fetch``), and the replies the MQTT bridge still owes (``mqtt_replies``).

May import config, the foundation, ``models.security``, ``models.jobs`` and ``models.access``."""
