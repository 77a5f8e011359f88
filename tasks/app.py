"""The Celery app, configured from the environment's Settings.

Importing it connects to nothing: the broker is contacted on the first publish or when
a worker starts. Without CELERY_BROKER_URL the import fails with a message saying so.
"""
from __future__ import annotations

from config import Settings, make_celery, publish_notify
from models.delivery import notify

celery_app = make_celery(Settings.from_env())
celery_app.set_default()
notify.set_publisher(lambda ids: publish_notify(celery_app, ids))
