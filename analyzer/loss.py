"""Loss per pair window against the loss a healthy path may show.

A window is lossy when a one-sided binomial test rejects "loss rate <=
baseline" at level alpha: a single lost probe out of hundreds is not an
incident, a steady 1 % is."""

from __future__ import annotations

import numpy as np
from scipy import stats


def loss_pvalues(sent: np.ndarray, lost: np.ndarray, baseline: float) -> np.ndarray:
    """P(X >= lost) for X ~ Binomial(sent, baseline), for every window at once."""
    sent = np.asarray(sent, dtype=np.int64)
    lost = np.asarray(lost, dtype=np.int64)
    return np.asarray(stats.binom.sf(lost - 1, sent, baseline), dtype=np.float64)


def lossy(sent: np.ndarray, lost: np.ndarray, baseline: float, alpha: float) -> np.ndarray:
    return (np.asarray(lost) > 0) & (loss_pvalues(sent, lost, baseline) < alpha)
