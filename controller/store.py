"""SQLite persistence for registrations and ping lists, so a restarted
controller loses nothing and agents simply reconnect."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from controller.pinglist import PingList, Target
from controller.registration import RegEndpoint, Registration
from netskel.sqlitefile import SqliteFile

_SCHEMA = """
CREATE TABLE IF NOT EXISTS registrations (container TEXT PRIMARY KEY, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS pinglists (
    container TEXT PRIMARY KEY, version INTEGER NOT NULL, doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS departed (container TEXT PRIMARY KEY);
"""


class Store(SqliteFile):
    def __init__(self, path: str | Path) -> None:
        super().__init__(path, _SCHEMA)

    def save_registration(self, reg: Registration) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO registrations VALUES (?, ?)",
                             (reg.container, json.dumps(asdict(reg))))

    def delete_registration(self, container: str, departed: bool = False) -> None:
        """With `departed`, the container left on purpose (Deregister): it
        stays out of every list, across restarts, until it registers again."""
        with self._lock:
            self._db.execute("BEGIN")
            self._db.execute("DELETE FROM registrations WHERE container = ?", (container,))
            if departed:
                self._db.execute("INSERT OR IGNORE INTO departed VALUES (?)", (container,))
            self._db.execute("COMMIT")

    def arrived(self, container: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM departed WHERE container = ?", (container,))

    def load_departed(self) -> set[str]:
        with self._lock:
            return {c for (c,) in self._db.execute("SELECT container FROM departed")}

    def load_registrations(self) -> dict[str, Registration]:
        with self._lock:
            rows = self._db.execute("SELECT doc FROM registrations").fetchall()
        regs = {}
        for (doc,) in rows:
            d = json.loads(doc)
            d["endpoints"] = tuple(RegEndpoint(**e) for e in d["endpoints"])
            reg = Registration(**d)
            regs[reg.container] = reg
        return regs

    def save_lists(self, changed: dict[str, tuple[int, PingList]]) -> None:
        """Write the changed lists in one transaction."""
        with self._lock:
            self._db.execute("BEGIN")
            for container, (version, plist) in changed.items():
                doc = json.dumps([asdict(t) for t in plist.values()])
                self._db.execute("INSERT OR REPLACE INTO pinglists VALUES (?, ?, ?)",
                                 (container, version, doc))
            self._db.execute("COMMIT")

    def load_lists(self) -> dict[str, tuple[int, PingList]]:
        with self._lock:
            rows = self._db.execute("SELECT container, version, doc FROM pinglists").fetchall()
        out = {}
        for container, version, doc in rows:
            targets = [Target(**t) for t in json.loads(doc)]
            out[container] = (int(version), {t.key: t for t in targets})
        return out
