"""Deterministic dataset mixing: which source serves mixed sample m, and its index in that source.

The rule is Megatron's blended dataset: sample m goes to the source furthest below its target share
(`weight * (m + 1) - served`), so over any prefix every source is within one sample of its target.
With weights rounded to multiples of 1/period, that greedy sequence repeats exactly every `period`
samples, so one period is computed once and any m is located in O(1): no replay from the start on
resume, whatever the position. The period is 10,000 samples, or the first of 100,000 and 1,000,000 at which
every source with a positive weight gets at least one sample (a weight below 1/2,000,000 of the total is
refused rather than served nothing).
"""

from __future__ import annotations

import os
from typing import Any, Iterator

import numpy as np

from dataflow.errors import ConfigError


def sources(source: Any) -> tuple[list[str], list[float] | None]:
    """The dataset paths of a `StreamingDataset` source (a path or URL, a list of them, or `{path: weight}`)
    and, when mixing, their weights; anything else is one `ConfigError` line, before any file is read."""
    if isinstance(source, dict):
        paths, weights = list(source), list(source.values())
        check_weights(weights)
    elif isinstance(source, (str, os.PathLike)):
        paths, weights = [source], None
    elif isinstance(source, (list, tuple)):
        paths, weights = list(source), None
    else:
        raise ConfigError(f"StreamingDataset takes a dataset path or URL, a list of them or {{path: weight}}, "
                          f"got {type(source).__name__}")
    if not paths:
        raise ConfigError("StreamingDataset needs at least one dataset path")
    for p in paths:
        if not isinstance(p, (str, os.PathLike)) or not str(p).strip():
            raise ConfigError(f"dataset paths must be non-empty strings (a folder or URL), got {p!r}")
    _refuse_twice([str(p) for p in paths])
    return [str(p) for p in paths], weights


def _refuse_twice(paths: list[str]) -> None:
    """One dataset listed twice (in any spelling: `ds`, `ds/`, `./ds`, `file://`, its index.json) would serve each
    of its samples twice an epoch: a mistake, said in one line (a mix's weights are how to weigh a source)."""
    seen: dict[str, str] = {}
    for p in paths:
        key = p[len("file://"):] if p.startswith("file://") else p
        key = key[:-len("index.json")] if key.endswith("/index.json") or key == "index.json" else key
        key = key.rstrip("/") if "://" in key else os.path.realpath(key or ".")
        if key in seen:
            raise ConfigError(f"StreamingDataset: {seen[key]!r} and {p!r} are the same dataset, listed twice: each of "
                              f"its samples would be served twice an epoch; list it once (in a {{path: weight}} mix, "
                              f"its weight says how much of it to serve)")
        seen[key] = p


def check_weights(weights: list[Any]) -> np.ndarray:
    """Mixing weights as float64; refused unless finite, >= 0 and with a positive sum."""
    try:
        if any(isinstance(x, (bool, str, bytes)) for x in weights):
            raise TypeError
        w = np.asarray([float(x) for x in weights], dtype=np.float64)
    except (TypeError, ValueError):
        raise ConfigError(f"mixing weights must be numbers, got {weights}") from None
    if len(w) == 0 or not np.isfinite(w).all() or (w < 0).any() or w.sum() <= 0:
        raise ConfigError(f"mixing weights must be finite, non-negative numbers with a positive sum, got {weights}")
    return w


PERIODS = (10_000, 100_000, 1_000_000)  # the first at which every positive weight gets a sample is used


class Blend:
    def __init__(self, weights: list[float]):
        w = check_weights(weights)
        for period in PERIODS:
            quota = _round_to_total(w / w.sum() * period, period)  # samples of each source per period
            if (quota[w > 0] > 0).all():
                break
        else:
            small = int(np.flatnonzero((w > 0) & (quota == 0))[0])
            raise ConfigError(f"mixing weight {weights[small]} (source {small}) is below 1/{2 * PERIODS[-1]:,} of "
                              f"the weights' sum: the mix would never serve it; raise it or leave the source out")
        self.weights = quota / period
        self.period = period
        self.quota = quota
        self.order, self.index = _greedy(self.weights.tolist(), period)

    def locate(self, m: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised: mixed sample ids -> (source, sample index within that source's stream)."""
        m = np.asarray(m, dtype=np.int64)
        p, r = np.divmod(m, self.period)
        source = self.order[r]
        return source, p * self.quota[source] + self.index[r]

    def split(self, m: np.ndarray, totals: list[int]) -> Iterator[tuple[int, int, np.ndarray, np.ndarray]]:
        """Mixed sample ids `m` by (source, that source's epoch): (source, epoch, sample ids within that
        epoch of the source, positions in `m`), each source going through epochs of `totals[source]` samples."""
        source, n = self.locate(m)
        for s in np.unique(source).tolist():
            sel = np.flatnonzero(source == s)
            epochs, g = np.divmod(n[sel], totals[s])
            for e in np.unique(epochs).tolist():
                sub = epochs == e
                yield s, e, g[sub], sel[sub]


def _greedy(weights: list[float], period: int) -> tuple[np.ndarray, np.ndarray]:
    """One period of the rule: each sample's source, and its index among that source's samples of the period.
    Plain Python floats (the same IEEE arithmetic as numpy's, the first source winning a tie): a million
    samples in about a second."""
    served = [0] * len(weights)
    order, index = [0] * period, [0] * period
    for m in range(period):
        t = m + 1
        best, lag = 0, weights[0] * t - served[0]
        for i in range(1, len(weights)):
            v = weights[i] * t - served[i]
            if v > lag:
                best, lag = i, v
        order[m], index[m] = best, served[best]
        served[best] += 1
    return np.array(order, dtype=np.int32), np.array(index, dtype=np.int64)


def _round_to_total(x: np.ndarray, total: int) -> np.ndarray:
    """Integers close to x that sum to `total` (largest remainders)."""
    base = np.floor(x).astype(np.int64)
    short = total - int(base.sum())
    if short > 0:
        base[np.argsort(-(x - base), kind="stable")[:short]] += 1
    return base
