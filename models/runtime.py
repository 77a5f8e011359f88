"""The per-process wiring of settings, database and storage."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from config import Settings

from models.db import Database
from models.storage import LocalStorage


@dataclass
class Runtime:
    settings: Settings
    db: Database = field(init=False)
    storage: LocalStorage = field(init=False)

    def __post_init__(self) -> None:
        from models.security.crypto import keyring_for, set_keyring

        set_keyring(keyring_for(self.settings))  # encryption at rest: files and transcripts
        self.db = Database(self.settings.database_url)
        self.storage = LocalStorage(self.settings.data_dir)


_runtime: Runtime | None = None
_lock = threading.Lock()


def get_runtime() -> Runtime:
    """This process's runtime, from the environment (workers and `transcribe.delay` callers)."""
    global _runtime
    if _runtime is None:
        with _lock:
            if _runtime is None:
                runtime = Runtime(Settings.from_env())
                runtime.db.upgrade()
                _runtime = runtime
    return _runtime


def reset_runtime() -> None:
    """Forget the runtime (after fork, or when tests change the environment)."""
    global _runtime
    if _runtime is not None:
        # The parent's pooled connections are shared with a forked child: let go of them
        # without closing them, or the parent's sessions break.
        _runtime.db.dispose(close=False)
    _runtime = None
