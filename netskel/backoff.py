"""Reconnect delays: exponential, capped, jittered so that many clients
losing one server do not come back in lock-step."""

from __future__ import annotations

import random
from dataclasses import dataclass


@dataclass
class Backoff:
    base: float = 0.5
    cap: float = 10.0
    attempt: int = 0

    def next(self) -> float:
        delay: float = min(self.cap, self.base * 2.0 ** self.attempt)
        self.attempt += 1
        return delay * random.uniform(0.5, 1.0)

    def reset(self) -> None:
        self.attempt = 0
