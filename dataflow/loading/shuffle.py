"""The epoch's sample order as pure functions of (seed, epoch, per-shard sample counts).

Two levels: the shards are permuted, then the samples inside each shuffle window, `shuffle_window`
consecutive shards (in that permuted order), are permuted together. A reader holds at most one window of
shards in memory, so `shuffle_window` is the knob that trades memory for randomness. Nothing here depends on the number
of ranks or workers: they only take different slices of the same global order.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np


def _rng(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(k) for k in key])))


def shard_order(num_shards: int, seed: int, epoch: int, shuffle: bool, stream: int = 0) -> np.ndarray:
    """The order in which shards are visited in this epoch."""
    if not shuffle:
        return np.arange(num_shards, dtype=np.int64)
    return _rng(seed, epoch, stream, 0).permutation(num_shards).astype(np.int64)


class EpochOrder:
    """Global sample g of an epoch -> (shard index, sample index inside that shard).

    Memory: the shard tables (O(shards)) plus the permutation of one window at a time.
    """

    def __init__(self, counts: np.ndarray, seed: int, epoch: int, shuffle: bool, shuffle_window: int, stream: int = 0):
        self.counts = np.asarray(counts, dtype=np.int64)
        self.seed, self.epoch, self.shuffle, self.stream = seed, epoch, shuffle, stream
        self.shuffle_window = max(1, int(shuffle_window))
        self.order = shard_order(len(self.counts), seed, epoch, shuffle, stream)
        ordered = self.counts[self.order]
        # start of each shard (in visiting order) in the global sample sequence
        self.shard_starts = np.concatenate([[0], np.cumsum(ordered)])
        self.window_starts = self.shard_starts[:: self.shuffle_window]
        if self.window_starts[-1] != self.shard_starts[-1]:
            self.window_starts = np.append(self.window_starts, self.shard_starts[-1])
        self.total = int(self.shard_starts[-1])
        self._perm = lru_cache(maxsize=2)(self._window_permutation)

    @property
    def num_windows(self) -> int:
        return len(self.window_starts) - 1

    def window_of(self, g: np.ndarray | int) -> np.ndarray:
        """The shuffle window (its number in this epoch) of global sample(s) `g`."""
        return np.searchsorted(self.window_starts, g, side="right") - 1

    def window_shards(self, window: int) -> np.ndarray:
        """Shard indices (into the manifest) of one window."""
        w = self.shuffle_window
        return self.order[window * w:(window + 1) * w]

    def _window_permutation(self, window: int) -> np.ndarray:
        size = int(self.window_starts[window + 1] - self.window_starts[window])
        if not self.shuffle:
            return np.arange(size, dtype=np.int64)
        return _rng(self.seed, self.epoch, self.stream, 1, window).permutation(size).astype(np.int64)

    def locate(self, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Vectorised: global sample ids -> (shard index, sample index within the shard)."""
        g = np.asarray(g, dtype=np.int64)
        if g.size and (g.min() < 0 or g.max() >= self.total):
            raise IndexError(f"sample id out of range [0, {self.total})")
        windows = self.window_starts.searchsorted(g, side="right") - 1
        first, last = int(windows.min(initial=0)), int(windows.max(initial=0))
        if first == last:  # the common case: a batch inside one window
            local = self._perm(first)[g - self.window_starts[first]] + self.window_starts[first]
        else:
            local = np.empty_like(g)
            for w in range(first, last + 1):
                sel = windows == w
                local[sel] = self._perm(w)[g[sel] - self.window_starts[w]] + self.window_starts[w]
        pos = self.shard_starts.searchsorted(local, side="right") - 1  # position in visiting order
        return self.order[pos], local - self.shard_starts[pos]
