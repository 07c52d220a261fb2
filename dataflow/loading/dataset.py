"""`StreamingDataset`: shards -> the epoch's global sample order -> one batch filled into a given buffer.

A sample is a packed window of `seq_len + 1` consecutive tokens of one shard's token stream (stride
`seq_len`, so every token is a label once), or, without `seq_len`, one document. The global order is a
pure function of (seed, epoch, manifest) (see `shuffle.py`); which samples each batch of a rank holds
is `plan.py`'s. The dataset keeps the position (epoch, consumed) that its iterator or a
`StreamingDataLoader` advances, and fills batches (`fill`) for whichever transport asks.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dataflow.errors import ConfigError
from dataflow.formats import remote
from dataflow.formats.manifest import Manifest, ShardInfo, TokenizerMeta, read_manifest
from dataflow.loading.mixing import Blend, sources
from dataflow.loading.plan import BatchPlan, LoaderState, rank_world
from dataflow.loading.shards import OpenShard
from dataflow.loading.shuffle import EpochOrder
from dataflow.loading import decoded as decoded_mod
from dataflow.loading.storage import Storage, prefetch_shards


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
        cache_dir: where remote shards are cached, shared by all processes of the machine (default
            `$DATAFLOW_CACHE`, else `$XDG_CACHE_HOME/dataflow`, else `~/.cache/dataflow`).
        cache_limit: bytes or "50GB" (default: half the free disk); least recently used shards not in
            use are evicted beyond it.
        storage_options: fsspec options for remote datasets (e.g. S3 `endpoint_url`, credentials).
        decode_once: zstd shards (Arrow and tar) are decompressed once per machine into the cache and
            memory-mapped by every worker and rank (they share its pages); False decompresses in each
            process instead.
        first_contact_s: seconds the first read of a remote dataset (its manifest) may take in all, retries
            included, before it is `UnreachableError` (default `$DATAFLOW_FIRST_CONTACT_S`, else 120).

    Iterated directly (or by torch's `DataLoader` with `num_workers=0`) it yields this rank's samples
    one at a time and tracks its position for `state_dict()`. Under torch's `DataLoader` with workers
    it serves every sample once, but the position lives in the workers, so `state_dict()` then raises
    rather than return a state that would repeat the epoch: use `StreamingDataLoader` to resume.
    """

    def __init__(self, source: str | list[str] | dict[str, float], *, seq_len: int | None = None,
                 shuffle: bool = True, seed: int = 0, shuffle_window: int = 8, rank: int | None = None,
                 world_size: int | None = None, position_ids: bool = False, cache_dir: str | None = None,
                 cache_limit: int | str | None = None, storage_options: dict[str, Any] | None = None,
                 decode_once: bool = True, first_contact_s: float | None = None):
        super().__init__()
        _check_arguments(locals())
        self.paths, weights = sources(source)
        with remote.first_contact(first_contact_s):
            self.manifests: list[Manifest] = [read_manifest(p, storage_options) for p in self.paths]
        self.tokenizer: TokenizerMeta = self.manifests[0].tokenizer
        for p, m in zip(self.paths[1:], self.manifests[1:]):
            if (m.tokenizer.kind, m.tokenizer.vocab_size, m.tokenizer.sha256) != \
                    (self.tokenizer.kind, self.tokenizer.vocab_size, self.tokenizer.sha256):
                raise ConfigError(f"{p} was tokenized with a different tokenizer than {self.paths[0]}")
        self.seq_len = seq_len = None if seq_len is None else int(seq_len)  # numpy integers as Python's
        self.shuffle, self.seed, self.shuffle_window = bool(shuffle), int(seed), int(shuffle_window)
        self.rank_arg, self.world_arg = (None if v is None else int(v) for v in (rank, world_size))
        self.position_ids, self.decode_once = bool(position_ids), bool(decode_once)
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
        self._starts = np.concatenate([[0], np.cumsum(self.counts)])  # stored order, for `ds[i]`
        # A stream is a run of shards with its own epoch order: one for a path or a list (read as one
        # dataset), one per source when mixing, each source then going through its own epochs.
        source_of = np.array([i for i, _ in self.shards], dtype=np.int64)
        if weights is None:
            self.streams = [np.arange(len(self.shards))]
            self.blend = None
        else:
            self.blend = Blend(weights)
            self.streams = [np.flatnonzero(source_of == i) for i in range(len(self.paths))]
            for path, stream, w in zip(self.paths, self.streams, self.blend.weights):
                if w > 0 and self.counts[stream].sum() == 0:
                    raise ConfigError(f"{path} has no sample of seq_len {seq_len}; it cannot be mixed in")
        self._check_not_empty()
        # per source: (format, token itemsize) when its zstd shards are decoded once per machine, else None
        self._decoded = [(m.format, np.dtype(m.dtype).itemsize) if decode_once and m.compression == "zstd" else None
                         for m in self.manifests]
        self._decoded = decoded_mod.usable(self.storages, self._decoded)  # a read-only cache: decode here
        self.fingerprint = self._fingerprint()
        self.epoch = 0
        self.consumed = 0  # global samples of this epoch already served; advanced only by an iterator
        self._in_torch_workers = torch.zeros(1, dtype=torch.uint8).share_memory_()  # set by a DataLoader worker
        self._orders: dict[tuple[int, int], EpochOrder] = {}
        self._open: dict[int, OpenShard] = {}
        self._current_blocks: dict[int, tuple[int, int]] = {}  # stream -> (its epoch, block) last read
        self._fetch_s = 0.0  # time opening (and downloading) shards in the current fill
        self._decode_wait_s = 0.0  # time waiting for decoded copies in the current fill
        self._blocks_key: tuple = ()
        self._ahead_key: tuple = ()

    def _check_not_empty(self) -> None:
        """A dataset that can yield no sample is a mistake: say why now, not after an empty epoch."""
        what = f"{self.paths[0]}" + (f" (+{len(self.paths) - 1} more)" if len(self.paths) > 1 else "")
        if self.num_samples == 0:
            if self.seq_len:
                longest = max((s.tokens for _, s in self.shards), default=0)
                raise ConfigError(f"{what}: no window of seq_len+1 = {self.seq_len + 1} tokens fits in a shard (the "
                                  f"largest holds {longest} tokens); lower seq_len or write larger shards")
            raise ConfigError(f"{what}: the dataset holds no document")
        _, world = self.rank_world()
        if self.num_samples < world:
            raise ConfigError(f"{what}: {self.num_samples} samples cannot give each of {world} ranks one; "
                              f"use fewer ranks{', or a shorter seq_len' if self.seq_len else ''}")

    def _fingerprint(self) -> str:
        """What the sample order depends on besides (seed, epoch): the shards' bytes and the sampling settings."""
        key = {"shards": [[i, s.sha256, s.tokens, s.documents] for i, s in self.shards], "seq_len": self.seq_len,
               "shuffle": self.shuffle, "window": self.shuffle_window,
               "weights": None if self.blend is None else self.blend.quota.tolist()}
        return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]

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
        return rank_world(self.rank_arg, self.world_arg)

    def __len__(self) -> int:
        """This rank's samples in one epoch (the same on every rank, whatever the position)."""
        return self.num_samples // self.rank_world()[1]

    def plan(self, batch_size: int = 1, drop_last: bool = True) -> BatchPlan:
        """This rank's batches from the current position to the end of the epoch."""
        rank, world = self.rank_world()
        return BatchPlan(self.epoch, self.consumed, self.num_samples, rank, world, batch_size, drop_last)

    # --- epoch and state ------------------------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        if isinstance(epoch, bool) or not isinstance(epoch, (int, np.integer)) or epoch < 0:
            raise ConfigError(f"set_epoch takes an integer >= 0, got {epoch!r}")
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

    def locate(self, ids: np.ndarray, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Global sample ids of an epoch (default: the current one) -> (shard index, sample index in the shard)."""
        ids = np.asarray(ids, dtype=np.int64)
        epoch = self.epoch if epoch is None else epoch
        if self.blend is None:
            return self._locate_in(0, epoch, ids)
        shards, within = np.empty_like(ids), np.empty_like(ids)
        totals = [int(self.counts[stream].sum()) for stream in self.streams]
        for s, e, g, idx in self.blend.split(epoch * self.num_samples + ids, totals):
            shards[idx], within[idx] = self._locate_in(s, e, g)
        return shards, within

    def _locate_in(self, stream: int, epoch: int, g: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        order = self.order(stream, epoch)
        k, j = order.locate(g)
        if len(g):
            self._current_blocks[stream] = (epoch, int(order.block_of(int(g[-1]))))
        return self.streams[stream][k], j

    def loader_state(self) -> LoaderState:
        return LoaderState(self.epoch, self.consumed, self.seed, self.num_samples, self.seq_len, self.fingerprint)

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, global samples consumed) and what it is valid for: small, JSON-serialisable."""
        if self._in_torch_workers[0]:
            raise ConfigError("this StreamingDataset was iterated by torch DataLoader workers, which keep its "
                              "position to themselves: state_dict() cannot say where to resume. Use "
                              "dataflow.StreamingDataLoader (it takes batch_size, num_workers, pin_memory, ...)")
        return self.loader_state().to_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = LoaderState.from_dict(state)
        saved.check_matches(self.loader_state())
        self.epoch, self.consumed = saved.epoch, saved.consumed

    # --- reading --------------------------------------------------------------------------------
    def _shard(self, k: int) -> OpenShard:
        shard = self._open.get(k)
        if shard is None:
            t0 = time.perf_counter()
            src, info = self.shards[k]
            m, storage = self.manifests[src], self.storages[src]
            t_decode = time.perf_counter()
            path, decoded = decoded_mod.path_to_read(storage, info, self._decoded[src])
            self._decoded[src] = decoded  # None from now on if the cache became unwritable
            waited = time.perf_counter() - t_decode if decoded else 0.0
            self._decode_wait_s += waited
            shard = self._open[k] = OpenShard(path, m.format, info, m.tokenizer.vocab_size, m.dtype,
                                              decoded_from=info.sha256 if decoded and m.format == "arrow" else None,
                                              name=storage.url(info))
            self._fetch_s += time.perf_counter() - t0 - waited
        return shard

    def close(self, wait: bool = True) -> None:
        """Let go of this process's open shards and cache locks now (the dataset stays usable: it opens
        them again when read); `wait=False` does not wait for downloads ahead (a worker about to exit)."""
        self._open.clear()
        self._blocks_key, self._ahead_key = (), ()
        for storage in self.storages:
            storage.close(wait)

    def _close_shard(self, k: int) -> None:
        del self._open[k]
        self.storages[self.shards[k][0]].release(self.shards[k][1])

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
            self._close_shard(k)

    def _work_ahead(self) -> None:
        """When a shuffle block starts: download/decode its shards and the next block's in the background,
        several at once, while this batch reads the first it needs."""
        key = tuple(sorted(self._current_blocks.items()))
        if key == self._ahead_key:
            return
        self._ahead_key = key
        ahead = [self.shards[k] for stream, (epoch, block) in self._current_blocks.items() for b in (block, block + 1)
                 for k in self.streams[stream][self.order(stream, epoch).block_shards(b)].tolist()]
        prefetch_shards(self.storages, ahead, self._decoded)

    def batch_layout(self, batch_size: int) -> dict[str, tuple[tuple[int, ...], Any]]:
        """Shapes and dtypes of a packed batch (what `fill` writes and a slot of the hand-off ring holds)."""
        if self.seq_len is None:
            raise ConfigError("whole-document batches have no fixed layout; set seq_len")
        fields = ["input_ids", "labels"] + (["position_ids"] if self.position_ids else [])
        return {k: ((batch_size, self.seq_len), np.int64) for k in fields}

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray], epoch: int | None = None) -> dict[str, float]:
        """Write the packed windows of global sample `ids` of `epoch` (default: the current one) into the
        first rows of `out` (arrays of `batch_layout`); returns the seconds of each stage (`stages.STAGES`)."""
        self._fetch_s = 0.0
        self._decode_wait_s = 0.0
        t0 = time.perf_counter()
        shard_ids, within = self.locate(ids, epoch)
        self._work_ahead()
        t1 = time.perf_counter()
        windows = self._windows(shard_ids, within)  # opens shards (fetch) and decompresses batches (read)
        t2 = time.perf_counter()
        self._pack(windows, shard_ids, within, out)
        t3 = time.perf_counter()
        self._evict_read_blocks()
        opening = self._fetch_s + self._decode_wait_s
        return {"shuffle": t1 - t0, "fetch": self._fetch_s, "decode": self._decode_wait_s,
                "read": max(t2 - t1 - opening, 0.0), "collate": t3 - t2, **self._totals()}

    def _totals(self) -> dict[str, float]:
        """This process's decoded-cache figures (`stages.TOTALS`), over all sources."""
        return {"shards_decoded": float(sum(s.decodes for s in self.storages)),
                "decode_hits": float(sum(s.decode_hits for s in self.storages)),
                "decode_cpu_s": sum(s.decode_s for s in self.storages)}

    def _windows(self, shard_ids: np.ndarray, within: np.ndarray) -> list[np.ndarray]:
        L = self.seq_len
        return [self._shard(k).window(j * L, L + 1) for k, j in zip(shard_ids.tolist(), within.tolist())]

    def _pack(self, windows: list[np.ndarray], shard_ids: np.ndarray, within: np.ndarray,
              out: dict[str, np.ndarray]) -> None:
        L = self.seq_len
        if windows:
            stacked = np.stack(windows)  # one uint16 copy, then two casting copies into the buffer
            np.copyto(out["input_ids"][:len(windows)], stacked[:, :-1])
            np.copyto(out["labels"][:len(windows)], stacked[:, 1:])
        positions = out.get("position_ids")
        if positions is not None:
            for i, (k, j) in enumerate(zip(shard_ids.tolist(), within.tolist())):
                positions[i] = _positions(self._shard(k).doc_boundaries(j * L, L), L)

    def documents(self, ids: np.ndarray, epoch: int | None = None) -> dict[str, Any]:
        """Whole documents of global sample `ids` (no `seq_len`): {"tokens": [LongTensor], "id": [str]}."""
        shard_ids, within = self.locate(ids, epoch)
        self._work_ahead()
        docs = [self._shard(int(k)).document(int(j)) for k, j in zip(shard_ids, within)]
        self._evict_read_blocks()
        return {"tokens": [torch.from_numpy(t.astype(np.int64)) for _, t in docs], "id": [d for d, _ in docs]}

    def __getitem__(self, i: int) -> dict[str, Any]:
        """Sample `i` of the dataset in stored order (shards in manifest order, unshuffled), 0 <= i < num_samples."""
        if self.blend is not None:
            raise ConfigError("a mix has no stored order to index: index one source's StreamingDataset instead")
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"StreamingDataset indices are integers, got {type(i).__name__}")
        n = self.num_samples
        if not -n <= i < n:
            raise IndexError(f"sample {i} is outside [0, {n})")
        i = int(i) % n
        k = int(np.searchsorted(self._starts, i, side="right") - 1)
        shard_ids, within = np.array([k]), np.array([i - int(self._starts[k])])
        if self.seq_len is None:
            doc_id, tokens = self._shard(k).document(int(within[0]))
            sample = {"tokens": torch.from_numpy(tokens.astype(np.int64)), "id": doc_id}
        else:
            out = {name: np.empty(shape, dtype) for name, (shape, dtype) in self.batch_layout(1).items()}
            self._pack(self._windows(shard_ids, within), shard_ids, within, out)
            sample = {name: torch.from_numpy(v[0]) for name, v in out.items()}
        while len(self._open) > self.shuffle_window:  # random access keeps a bounded set of shards open
            self._close_shard(next(iter(self._open)))
        return sample

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_open"], state["_orders"], state["_blocks_key"], state["_ahead_key"] = {}, {}, (), ()  # per process
        return state

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """This rank's samples one by one from the current position; the position follows what is yielded."""
        info = get_worker_info()
        if info is not None:  # torch's DataLoader worker: serve this worker's share, untracked
            self._in_torch_workers[0] = 1
        worker, workers = (info.id, info.num_workers) if info else (0, 1)
        plan = self.plan(batch_size=1)
        for b in range(worker, plan.num_batches, workers):
            ids = plan.sample_ids(b)
            if self.seq_len is None:
                batch = self.documents(ids, plan.epoch)
                sample = {k: v[0] for k, v in batch.items()}
            else:
                out = {name: np.empty(shape, dtype) for name, (shape, dtype) in self.batch_layout(1).items()}
                self.fill(ids, out, plan.epoch)
                sample = {k: torch.from_numpy(v[0]) for k, v in out.items()}
            if info is None:
                self.consumed = plan.consumed_after(b + 1)
            yield sample
        if info is None:
            self.epoch, self.consumed = plan.epoch + 1, 0


def _int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


_ARGUMENTS: dict[str, tuple[Any, str]] = {  # StreamingDataset's arguments: (acceptable?, what they must be)
    "seq_len": (lambda v: v is None or _int(v) and v >= 1, "a positive integer or None"),
    "shuffle": (lambda v: isinstance(v, (bool, np.bool_)), "True or False"),
    "seed": (lambda v: _int(v) and 0 <= v < 2**64, "an integer in [0, 2^64)"),
    "shuffle_window": (lambda v: _int(v) and v >= 1, "a positive integer"),
    "rank": (lambda v: v is None or _int(v) and v >= 0, "an integer >= 0, or None (torch.distributed's)"),
    "world_size": (lambda v: v is None or _int(v) and v >= 1, "an integer >= 1, or None (torch.distributed's)"),
    "position_ids": (lambda v: isinstance(v, (bool, np.bool_)), "True or False"),
    "cache_dir": (lambda v: v is None or isinstance(v, (str, os.PathLike)) and str(v).strip() != "",
                  "a folder, or None"),
    "cache_limit": (lambda v: v is None or isinstance(v, str) or _int(v), "a size like '50GB', bytes, or 'none'"),
    "storage_options": (lambda v: v is None or isinstance(v, dict), "a dict of fsspec options, or None"),
    "decode_once": (lambda v: isinstance(v, (bool, np.bool_)), "True or False"),
    "first_contact_s": (lambda v: v is None or _number(v) and 0 < v < float("inf"), "a positive number, or None"),
}


def _check_arguments(given: dict[str, Any]) -> None:
    """One `ConfigError` line for a StreamingDataset argument that cannot work, before any file is read."""
    for name, (acceptable, want) in _ARGUMENTS.items():
        if not acceptable(given[name]):
            raise ConfigError(f"StreamingDataset: {name} must be {want}, got {given[name]!r}")
    rank, world = given["rank"], given["world_size"]
    if rank is not None and world is not None and rank >= world:
        raise ConfigError(f"StreamingDataset: rank {rank} is outside world_size {world} (ranks are 0 to {world - 1})")


def _positions(boundaries: np.ndarray, length: int) -> np.ndarray:
    """Position ids 0,1,2,... restarting at each document boundary inside the window."""
    pos = np.arange(length, dtype=np.int64)
    if boundaries.size:
        starts = np.concatenate([[0], boundaries])
        seg = np.searchsorted(starts, pos, side="right") - 1
        pos -= starts[seg]
    return pos
