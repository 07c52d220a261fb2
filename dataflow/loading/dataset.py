"""`StreamingDataset`: shards -> the epoch's global sample order -> this rank's samples.

A sample is a packed window of `seq_len + 1` consecutive tokens of one shard's token stream (stride
`seq_len`, so every token is a label once), or, without `seq_len`, one document. The global order is a
pure function of (seed, epoch, manifest) (see `shuffle.py`); rank r serves global samples
`consumed + r + world_size * j`. The whole resume state is therefore (epoch, consumed): any number of
ranks or workers can continue from it.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dataflow.errors import ConfigError, FormatError
from dataflow.formats.manifest import Manifest, ShardInfo, TokenizerMeta, read_manifest
from dataflow.loading.shards import OpenShard
from dataflow.loading.mixing import Blend
from dataflow.loading.shuffle import EpochOrder
from dataflow.loading.storage import Storage, prefetch_shards

STATE_VERSION = 1
STAGES = ("fetch", "read", "shuffle", "collate")  # what `collate_into` times, in seconds


def _rank_world(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None or world_size is not None:
        rank, world_size = rank or 0, world_size or 1
    elif torch.distributed.is_available() and torch.distributed.is_initialized():
        rank, world_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    else:
        rank, world_size = 0, 1
    if not 0 <= rank < world_size:
        raise ConfigError(f"rank {rank} is outside world size {world_size}")
    return rank, world_size


class StreamingDataset(IterableDataset):
    """Deterministically shuffled, rank-partitioned, exactly resumable token samples.

    Args:
        source: a dataset folder or URL; a list of them (their shards are read as one dataset); or
            `{path: weight}` to mix datasets: each source goes through its own epochs, and over any
            prefix each is within one sample of its share (see `mixing.py`).
        seq_len: pack documents into windows of seq_len+1 tokens; None yields whole documents.
        shuffle, seed: the epoch order is a pure function of (seed, epoch, manifest).
        shuffle_window: shards whose samples are shuffled together; memory holds about this many
            decompressed shards. Larger is more random.
        rank, world_size: override torch.distributed's.
        position_ids: also yield `position_ids` that restart at each document (for document masking).
        cache_dir: where remote shards are cached (default `$DATAFLOW_CACHE`, shared by all processes).
        cache_limit: bytes or "50GB": least recently used shards not in use are evicted beyond it.
        storage_options: fsspec options for remote datasets (e.g. S3 `endpoint_url`, credentials).
    """

    def __init__(self, source: str | list[str] | dict[str, float], *, seq_len: int | None = None,
                 shuffle: bool = True, seed: int = 0, shuffle_window: int = 8, rank: int | None = None,
                 world_size: int | None = None, position_ids: bool = False, cache_dir: str | None = None,
                 cache_limit: int | str | None = None, storage_options: dict[str, Any] | None = None):
        super().__init__()
        weights = None
        if isinstance(source, dict):
            paths, weights = list(source), [float(w) for w in source.values()]
        else:
            paths = [source] if isinstance(source, (str, os.PathLike)) else list(source)
        if not paths:
            raise ConfigError("StreamingDataset needs at least one dataset path")
        if seq_len is not None and seq_len < 1:
            raise ConfigError(f"seq_len must be positive, got {seq_len}")
        self.paths = [str(p) for p in paths]
        self.manifests: list[Manifest] = [read_manifest(p, storage_options) for p in self.paths]
        self.tokenizer: TokenizerMeta = self.manifests[0].tokenizer
        for p, m in zip(self.paths[1:], self.manifests[1:]):
            if (m.tokenizer.kind, m.tokenizer.vocab_size, m.tokenizer.sha256) != \
                    (self.tokenizer.kind, self.tokenizer.vocab_size, self.tokenizer.sha256):
                raise ConfigError(f"{p} was tokenized with a different tokenizer than {self.paths[0]}")
        self.seq_len = seq_len
        self.shuffle, self.seed, self.shuffle_window = shuffle, seed, shuffle_window
        self.rank_arg, self.world_arg = rank, world_size
        self.position_ids = position_ids
        self.storages = [Storage(p, cache_dir, cache_limit=cache_limit, storage_options=storage_options)
                         for p in self.paths]
        self.shards: list[tuple[int, ShardInfo]] = [(i, s) for i, m in enumerate(self.manifests) for s in m.shards]
        tokens = np.array([s.tokens for _, s in self.shards], dtype=np.int64)
        if seq_len:
            self.counts = np.maximum(tokens - 1, 0) // seq_len
            self.dropped_tokens = int((tokens - self.counts * seq_len).sum())  # shard tails, counted
        else:
            self.counts = np.array([s.documents for _, s in self.shards], dtype=np.int64)
            self.dropped_tokens = 0
        # A stream is a run of shards with its own epoch order: one for a path or a list (read as one
        # dataset), one per source when mixing, each source then going through its own epochs.
        source_of = np.array([i for i, _ in self.shards], dtype=np.int64)
        if weights is None:
            self.streams = [np.arange(len(self.shards))]
            self.blend = None
        else:
            self.streams = [np.flatnonzero(source_of == i) for i in range(len(paths))]
            self.blend = Blend(weights)
            for path, stream, w in zip(self.paths, self.streams, weights):
                if w > 0 and self.counts[stream].sum() == 0:
                    raise ConfigError(f"{path} has no sample of seq_len {seq_len}; it cannot be mixed in")
        self.epoch = 0
        self.consumed = 0  # global samples of this epoch already served (set by load_state_dict)
        self._orders: dict[tuple[int, int], EpochOrder] = {}
        self._open: dict[int, OpenShard] = {}
        self._current_blocks: dict[int, tuple[int, int]] = {}  # stream -> (its epoch, block) last read
        self._fetch_s = 0.0  # time opening (and downloading) shards in the current collate_into
        self._blocks_key: tuple = ()

    # --- sizes ----------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def num_samples(self) -> int:
        """Samples in one epoch, all ranks together."""
        return int(self.counts.sum())

    def rank_world(self) -> tuple[int, int]:
        return _rank_world(self.rank_arg, self.world_arg)

    def samples_per_rank(self, consumed: int | None = None) -> int:
        """Samples each rank serves from `consumed` to the end of the epoch (equal on every rank)."""
        _, world = self.rank_world()
        return (self.num_samples - (self.consumed if consumed is None else consumed)) // world

    def __len__(self) -> int:
        return self.samples_per_rank()

    # --- epoch and state ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        if epoch != self.epoch:
            self.epoch, self.consumed = int(epoch), 0

    def order(self, stream: int = 0, epoch: int | None = None) -> EpochOrder:
        """The sample order of one stream's epoch (a pure function of seed, epoch and the manifest)."""
        epoch = self.epoch if epoch is None else epoch
        key = (stream, epoch)
        if key not in self._orders:
            if len(self._orders) >= 2 * len(self.streams):
                self._orders.pop(next(iter(self._orders)))
            self._orders[key] = EpochOrder(self.counts[self.streams[stream]], self.seed, epoch, self.shuffle,
                                           self.shuffle_window, stream=stream)
        return self._orders[key]

    def locate(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global sample ids of this epoch -> (shard index, sample index within the shard)."""
        ids = np.asarray(ids, dtype=np.int64)
        if self.blend is None:
            return self._locate_in(0, self.epoch, ids)
        source, n = self.blend.locate(self.epoch * self.num_samples + ids)
        shards, within = np.empty_like(ids), np.empty_like(ids)
        for s in np.unique(source).tolist():
            sel = source == s
            total = int(self.counts[self.streams[s]].sum())
            epochs, g = np.divmod(n[sel], total)
            for e in np.unique(epochs).tolist():
                sub = epochs == e
                k, j = self._locate_in(s, e, g[sub])
                idx = np.flatnonzero(sel)[sub]
                shards[idx], within[idx] = k, j
        return shards, within

    def _locate_in(self, stream: int, epoch: int, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = self.order(stream, epoch)
        k, j = order.locate(g)
        if len(g):
            self._current_blocks[stream] = (epoch, int(order.block_of(int(g[-1]))))
        return self.streams[stream][k], j

    def state_dict(self) -> dict[str, Any]:
        return {"version": STATE_VERSION, "epoch": self.epoch, "consumed": self.consumed, "seed": self.seed,
                "num_samples": self.num_samples, "seq_len": self.seq_len}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"loader state version {state.get('version')} is not {STATE_VERSION}")
        for key in ("seq_len", "seed", "num_samples"):
            if state[key] != getattr(self, key):
                raise ConfigError(f"cannot resume: the state was saved with {key}={state[key]}, this dataset "
                                  f"has {key}={getattr(self, key)} (different data or settings)")
        if not 0 <= state["consumed"] <= self.num_samples:
            raise ConfigError(f"cannot resume: consumed={state['consumed']} outside this epoch")
        self.epoch, self.consumed = int(state["epoch"]), int(state["consumed"])

    # --- reading --------------------------------------------------------------------------------
    def rank_sample_ids(self, start: int, stop: int, consumed: int | None = None) -> np.ndarray:
        """Global ids of this rank's samples j in [start, stop) from position `consumed`."""
        rank, world = self.rank_world()
        base = self.consumed if consumed is None else consumed
        return base + rank + world * np.arange(start, stop, dtype=np.int64)

    def _shard(self, k: int) -> OpenShard:
        shard = self._open.get(k)
        if shard is None:
            t0 = time.perf_counter()
            src, info = self.shards[k]
            manifest = self.manifests[src]
            shard = self._open[k] = OpenShard(self.storages[src].local_path(info), manifest.format)
            if shard.token_starts[-1] != info.tokens:
                raise FormatError(f"{shard.path}: holds {shard.token_starts[-1]} tokens, the manifest says "
                                  f"{info.tokens}; run `dataflow verify`")
            self._fetch_s += time.perf_counter() - t0
        return shard

    def _evict_read_blocks(self) -> None:
        """Drop open shards outside each stream's current shuffle block: they are done for this epoch."""
        key = tuple(sorted(self._current_blocks.items()))
        if key == self._blocks_key:
            return
        self._blocks_key = key
        keep = set()
        for stream, (epoch, block) in self._current_blocks.items():
            keep.update(self.streams[stream][self.order(stream, epoch).block_shards(block)].tolist())
        for k in [k for k in self._open if k not in keep]:
            del self._open[k]
            self.storages[self.shards[k][0]].release(self.shards[k][1])
        ahead = [self.shards[k] for stream, (epoch, block) in self._current_blocks.items()
                 for k in self.streams[stream][self.order(stream, epoch).block_shards(block + 1)].tolist()]
        prefetch_shards(self.storages, ahead)  # download the next block while this one is read

    def batch_layout(self, batch_size: int) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Shapes and dtypes of a packed batch (what a slot of the hand-off ring holds)."""
        if self.seq_len is None:
            raise ConfigError("whole-document batches have no fixed layout; set seq_len")
        fields = ["input_ids", "labels"] + (["position_ids"] if self.position_ids else [])
        return {k: ((batch_size, self.seq_len), np.int64) for k in fields}

    def collate_into(self, ids: np.ndarray, out: dict[str, np.ndarray]) -> dict[str, float]:
        """Write the packed windows of global sample `ids` into the rows of `out`; returns stage times."""
        self._fetch_s = 0.0
        t0 = time.perf_counter()
        shard_ids, within = self.locate(ids)
        L = self.seq_len
        inputs, labels = out["input_ids"], out["labels"]
        positions = out.get("position_ids")
        t1 = time.perf_counter()
        windows = [self._shard(k).window(j * L, L + 1) for k, j in zip(shard_ids.tolist(), within.tolist())]
        t2 = time.perf_counter()
        if windows:
            stacked = np.stack(windows)  # one uint16 copy, then two casting copies into the slot
            np.copyto(inputs[:len(windows)], stacked[:, :-1])
            np.copyto(labels[:len(windows)], stacked[:, 1:])
        if positions is not None:
            for i, (k, j) in enumerate(zip(shard_ids.tolist(), within.tolist())):
                positions[i] = _positions(self._shard(k).doc_boundaries(j * L, L), L)
        t3 = time.perf_counter()
        self._evict_read_blocks()
        fetch = self._fetch_s
        return {"shuffle": t1 - t0, "fetch": fetch, "read": max(t2 - t1 - fetch, 0.0), "collate": t3 - t2}

    def collate(self, ids: np.ndarray, stats: dict[str, float] | None = None) -> dict[str, Any]:
        """A batch of the given global sample ids as a dict of stacked tensors; adds stage times to `stats`."""
        if self.seq_len is None:
            shard_ids, within = self.locate(ids)
            docs = [self._shard(int(k)).document(int(j)) for k, j in zip(shard_ids, within)]
            self._evict_read_blocks()
            return {"tokens": [torch.from_numpy(t.astype(np.int64)) for _, t in docs], "id": [d for d, _ in docs]}
        out = {k: np.empty(shape, dtype)
               for k, (shape, dtype) in self.batch_layout(len(ids)).items()}
        times = self.collate_into(ids, out)
        if stats is not None:
            for k, v in times.items():
                stats[k] = stats.get(k, 0.0) + v
        return {k: torch.from_numpy(v) for k, v in out.items()}

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"], state["_orders"], state["_blocks_key"] = {}, {}, ()  # these stay with their process
        return state

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """This rank's samples one by one (split across DataLoader workers when inside one)."""
        info = get_worker_info()
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        start_consumed = self.consumed
        for j in range(worker, self.samples_per_rank(start_consumed), workers):
            batch = self.collate(self.rank_sample_ids(j, j + 1, start_consumed))
            yield {k: v[0] for k, v in batch.items()}
            if info is None:
                self.consumed = start_consumed + (j + 1) * self.rank_world()[1]
        if info is None:
            self.epoch, self.consumed = self.epoch + 1, 0


def _positions(boundaries: np.ndarray, length: int) -> np.ndarray:
    """Position ids 0,1,2,... restarting at each document boundary inside the window."""
    pos = np.arange(length, dtype=np.int64)
    if boundaries.size:
        starts = np.concatenate([[0], boundaries])
        seg = np.searchsorted(starts, pos, side="right") - 1
        pos -= starts[seg]
    return pos
