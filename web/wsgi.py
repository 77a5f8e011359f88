"""WSGI entry point for gunicorn: `gunicorn web.wsgi:app`."""

from web.app import create_app

app = create_app()
