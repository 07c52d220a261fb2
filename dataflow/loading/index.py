"""`SampleIndex`: manifests -> samples per shard, streams and mixing, fingerprint, the epoch order, and
where each global sample of an epoch lives. Pure: it reads no shard and keeps no position (the only
state is a memo of epoch orders, a pure function of seed, epoch and manifest).

A sample is a packed run of `seq_len + 1` consecutive tokens of one shard's token stream (stride
`seq_len`, so every token is a label once), or, without `seq_len`, one document. A stream is a run
of shards with its own epoch order: one for a path or a list (read as one dataset), one per source
when mixing, each source then going through its own epochs (see `mixing.py`).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import numpy as np

from dataflow.errors import ConfigError
from dataflow.formats.manifest import Manifest, ShardInfo, TokenizerMeta
from dataflow.loading.mixing import Blend
from dataflow.loading.shuffle import EpochOrder

CurrentWindows = dict[int, tuple[int, int]]  # stream -> (its epoch, shuffle window) of the last sample located


class SampleIndex:
    """Which shard and which sample in it each global sample id of an epoch is, for given settings."""

    def __init__(self, paths: list[str], manifests: list[Manifest], weights: Any, seq_len: int | None,
                 shuffle: bool, seed: int, shuffle_window: int):
        self.paths, self.manifests = paths, manifests
        self.tokenizer: TokenizerMeta = manifests[0].tokenizer
        for p, m in zip(paths[1:], manifests[1:]):
            if (m.tokenizer.kind, m.tokenizer.vocab_size, m.tokenizer.sha256) != \
                    (self.tokenizer.kind, self.tokenizer.vocab_size, self.tokenizer.sha256):
                raise ConfigError(f"{p} was tokenized with a different tokenizer than {paths[0]}")
        self.seq_len, self.shuffle, self.seed, self.shuffle_window = seq_len, shuffle, seed, shuffle_window
        self.shards: list[tuple[int, ShardInfo]] = [(i, s) for i, m in enumerate(manifests) for s in m.shards]
        tokens = np.array([s.tokens for _, s in self.shards], dtype=np.int64)
        if seq_len:
            self.counts = np.maximum(tokens - 1, 0) // seq_len
            # shard tails: tokens in no sample (a sample's last token, its last label, starts the next one's)
            self.dropped_tokens = int((tokens - np.where(self.counts > 0, self.counts * seq_len + 1, 0)).sum())
        else:
            self.counts = np.array([s.documents for _, s in self.shards], dtype=np.int64)
            self.dropped_tokens = 0
        self.starts = np.concatenate([[0], np.cumsum(self.counts)])  # stored order, for `ds[i]`
        source_of = np.array([i for i, _ in self.shards], dtype=np.int64)
        if weights is None:
            self.streams = [np.arange(len(self.shards))]
            self.blend: Blend | None = None
        else:
            self.blend = Blend(weights)
            self.streams = [np.flatnonzero(source_of == i) for i in range(len(paths))]
            for path, stream, w in zip(paths, self.streams, self.blend.weights):
                if w > 0 and self.counts[stream].sum() == 0:
                    raise ConfigError(f"{path} has no sample of seq_len {seq_len}; it cannot be mixed in")
        self.num_samples = int(self.counts.sum())  # one epoch, all ranks together
        self.fingerprint = self._fingerprint()
        self._orders: dict[tuple[int, int], EpochOrder] = {}

    def _fingerprint(self) -> str:
        """What the sample order depends on besides (seed, epoch): the shards' bytes and the sampling settings."""
        key = {"shards": [[i, s.sha256, s.tokens, s.documents] for i, s in self.shards], "seq_len": self.seq_len,
               "shuffle": self.shuffle, "window": self.shuffle_window,
               "weights": None if self.blend is None else self.blend.quota.tolist()}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

    def order(self, stream: int, epoch: int) -> EpochOrder:
        """The sample order of one stream's epoch (memoised: a few epochs per stream)."""
        key = (stream, epoch)
        if key not in self._orders:
            if len(self._orders) >= 2 * len(self.streams):
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = EpochOrder(self.counts[self.streams[stream]], self.seed, epoch, self.shuffle,
                                           self.shuffle_window, stream=stream)
        return self._orders[key]

    def locate(self, ids: np.ndarray, epoch: int) -> tuple[np.ndarray, np.ndarray, CurrentWindows]:
        """Global sample ids of `epoch` -> (shard index, sample index in the shard, the shuffle window of
        each stream's last sample): where to read, and which windows are current once it is read."""
        ids = np.asarray(ids, dtype=np.int64)
        windows: CurrentWindows = {}
        if self.blend is None:
            shards, within = self._locate_in(0, epoch, ids, windows)
            return shards, within, windows
        shards, within = np.empty_like(ids), np.empty_like(ids)
        totals = [int(self.counts[stream].sum()) for stream in self.streams]
        for s, e, g, idx in self.blend.split(epoch * self.num_samples + ids, totals):
            shards[idx], within[idx] = self._locate_in(s, e, g, windows)
        return shards, within, windows

    def _locate_in(self, stream: int, epoch: int, g: np.ndarray, windows: CurrentWindows) -> tuple[np.ndarray, np.ndarray]:
        order = self.order(stream, epoch)
        k, j = order.locate(g)
        if len(g):
            windows[stream] = (epoch, int(order.window_of(int(g[-1]))))
        return self.streams[stream][k], j

    def window_shards(self, stream: int, epoch: int, window: int) -> list[int]:
        """Shard indices of one shuffle window of a stream's epoch."""
        return self.streams[stream][self.order(stream, epoch).window_shards(window)].tolist()

    def stored(self, i: int) -> tuple[int, int]:
        """Sample `i` in stored order (shards in manifest order, unshuffled) -> (shard index, sample in it)."""
        k = int(np.searchsorted(self.starts, i, side="right") - 1)
        return k, i - int(self.starts[k])

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_orders": {}}  # a memo: each process builds its own
