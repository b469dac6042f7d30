"""Progress of long offline runs, on stderr: rewritten in place on a
terminal, one line per change of stage (and at most every few seconds)
when stderr is a file, so logs of batch runs stay short."""

from __future__ import annotations

import sys
import time
from typing import TextIO


class Progress:
    def __init__(self, stream: TextIO | None = None, min_interval_s: float = 0.5,
                 log_interval_s: float = 5.0) -> None:
        self.stream = stream or sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every = min_interval_s if self.tty else log_interval_s
        self._last = 0.0
        self._stage = ""
        self._t0 = time.monotonic()

    def __call__(self, stage: str, done: int = 0, total: int = 0) -> None:
        now = time.monotonic()
        final = total > 0 and done >= total
        if stage == self._stage and not final and now - self._last < self.every:
            return
        self._stage, self._last = stage, now
        pct = f" {100 * done // total:3d}% ({done}/{total})" if total else ""
        line = f"[{now - self._t0:6.1f}s] {stage}{pct}"
        if self.tty:
            self.stream.write("\r\033[K" + line + ("\n" if final else ""))
        else:
            self.stream.write(line + "\n")
        self.stream.flush()
