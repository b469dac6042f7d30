"""One SQLite file in WAL mode shared by a service's threads: the
controller's registrations and lists, the analyzer's incidents."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path


class SqliteFile:
    """Autocommit connection (transactions are explicit), durable at each
    commit against a process kill; one lock serializes its users."""

    def __init__(self, path: str | Path, schema: str) -> None:
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(schema)

    def close(self) -> None:
        with self._lock:
            self._db.close()
