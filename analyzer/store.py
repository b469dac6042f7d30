"""SQLite (WAL) persistence of the analyzer's incidents, so a restarted
analyzer (even after SIGKILL) keeps every open incident under its id and
never reuses an id: a diagnosis engine holding `inc-000017` still finds it.

Written after each tick that changed something (one transaction), read
once at start. Baselines are not stored: they rebuild from the next
windows, and an open incident stays open until clean windows close it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from netskel.model import Component, Incident
from netskel.sqlitefile import SqliteFile

_SCHEMA = """
CREATE TABLE IF NOT EXISTS incidents (
    id TEXT PRIMARY KEY, open_in TEXT NOT NULL, start REAL NOT NULL, end_ts REAL,
    doc TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


def _to_json(inc: Incident) -> str:
    return json.dumps(inc.to_doc(), default=str)


def _from_json(text: str) -> Incident:
    d: dict[str, Any] = json.loads(text)
    return Incident(id=d["id"], start=d["start"], end=d["end"], symptom=d["symptom"],
                    layer=d["layer"], component=Component(d["component"]["type"],
                                                          d["component"]["id"]),
                    pairs=[(p[0], p[1]) for p in d["pairs"]], confidence=d["confidence"],
                    evidence=d.get("evidence") or {})


class IncidentStore(SqliteFile):
    def __init__(self, path: str | Path) -> None:
        super().__init__(path, _SCHEMA)

    def save(self, incidents: Sequence[tuple[Incident, str]], seq: int,
             removed: Sequence[str] = ()) -> None:
        """Incidents with the open map holding them ("" when closed), the id
        counter, and ids retention removed: one transaction."""
        with self._lock:
            self._db.execute("BEGIN")
            try:
                self._db.executemany(
                    "INSERT OR REPLACE INTO incidents VALUES (?, ?, ?, ?, ?)",
                    [(i.id, where, i.start, i.end, _to_json(i)) for i, where in incidents])
                self._db.executemany("DELETE FROM incidents WHERE id = ?", [(r,) for r in removed])
                self._db.execute("INSERT OR REPLACE INTO meta VALUES ('seq', ?)", (str(seq),))
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise

    def load(self) -> tuple[list[tuple[Incident, str]], int]:
        with self._lock:
            rows = self._db.execute("SELECT doc, open_in FROM incidents ORDER BY id").fetchall()
            seq = self._db.execute("SELECT value FROM meta WHERE key = 'seq'").fetchone()
        return [(_from_json(doc), where) for doc, where in rows], int(seq[0]) if seq else 0
