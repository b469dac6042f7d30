"""One SQLite file in WAL mode shared by a service's threads: the
controller's registrations and lists, the analyzer's incidents."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from netskel.errors import OutputError


class SqliteFile:
    """Autocommit connection (transactions are explicit), durable at each
    commit against a process kill; one lock serializes its users."""

    def __init__(self, path: str | Path, schema: str) -> None:
        self._lock = threading.Lock()
        try:
            self._db = sqlite3.connect(str(path), check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(schema)
        except sqlite3.Error as e:  # no such directory, a file that is no database
            raise OutputError(f"{path}: cannot keep the service's state there ({e})") from None

    def close(self) -> None:
        with self._lock:
            self._db.close()
