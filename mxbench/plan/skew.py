"""The skewed (router-like) split shared by the step's token groups and EP's routing: Dirichlet(``SKEW_ALPHA``) shares.

Apart from ``points`` (which imports mxkernels, hence torch and triton): the EP projection reads a skewed run's
rank shares from stored runs without them."""

from __future__ import annotations

import numpy as np

# Concentration of the skewed (router-like) split: Dirichlet(0.5) over experts gives the heavy few and the idle
# many of an imperfectly balanced router (the largest of 8 groups typically holds 2-4x the balanced share).
SKEW_ALPHA = 0.5


def skewed_shares(n: int, seed: int) -> np.ndarray:
    """The ``n`` shares (summing to 1) of the skewed split drawn from ``seed``: the same on every rank and run."""
    return np.random.default_rng(seed).dirichlet(np.full(n, SKEW_ALPHA))
