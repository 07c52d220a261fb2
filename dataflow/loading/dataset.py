"""`StreamingDataset`: the public face of the loading data: argument checks, `IterableDataset`, `ds[i]`.

Three parts, one job each: `SampleIndex` (index.py, pure: manifests, counts, mixing, fingerprint,
epoch order, where a sample lives), `ShardReader` (reader.py, per process: open shards, work-ahead,
eviction) and the `Cursor` (cursor.py: the position (epoch, consumed) and its saved form, moved only
by `Cursor.follow`). This class wires them and implements the `SampleSource` contract (contract.py)
that `StreamingDataLoader` and its workers use: `fill` one batch's samples into a given buffer,
`documents`, `batch_layout`. Which samples each batch of a rank holds is `plan.py`'s.
"""

from __future__ import annotations

import os
import time
from typing import Any, Iterator

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from dataflow.audit.log import AuditLog
from dataflow.errors import ConfigError
from dataflow.formats import remote
from dataflow.formats.manifest import Manifest, ShardInfo, TokenizerMeta, read_manifest
from dataflow.loading.contract import BatchLayout, FillReport
from dataflow.loading.cursor import Cursor, LoaderState
from dataflow.loading.index import SampleIndex
from dataflow.loading.mixing import Blend, sources
from dataflow.loading.plan import BatchPlan, rank_world
from dataflow.loading.reader import OpenTimes, ShardReader
from dataflow.loading.shuffle import EpochOrder
from dataflow.loading.storage import Storage

class StreamingDataset(IterableDataset):
    """Deterministically shuffled, rank-partitioned, exactly resumable token samples.

    Args:
        source: a dataset folder or URL; a list of them (their shards are read as one dataset); or
            `{path: weight}` to mix datasets: each source goes through its own epochs, and over any
            prefix each is within one sample of its share (see `mixing.py`).
        seq_len: pack documents into samples of seq_len+1 tokens; None yields whole documents.
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
        audit: a folder: the global sample positions served, as they are yielded, are appended to
            `audit/audit-rank-R.jsonl` (a `StreamingDataLoader` over this dataset records there too);
            `dataflow audit DIR` checks every sample of each epoch was served once (`dataflow/audit/`).

    Iterated directly (or by torch's `DataLoader` with `num_workers=0`) it yields this rank's samples
    one at a time and tracks its position for `state_dict()`. Under torch's `DataLoader` with workers
    it serves every sample once, but the position lives in the workers, so `state_dict()` then raises
    rather than return a state that would repeat the epoch: use `StreamingDataLoader` to resume.
    """

    def __init__(self, source: str | list[str] | dict[str, float], *, seq_len: int | None = None,
                 shuffle: bool = True, seed: int = 0, shuffle_window: int = 8, rank: int | None = None,
                 world_size: int | None = None, position_ids: bool = False, cache_dir: str | None = None,
                 cache_limit: int | str | None = None, storage_options: dict[str, Any] | None = None,
                 decode_once: bool = True, first_contact_s: float | None = None,
                 audit: str | os.PathLike | None = None):
        super().__init__()
        _check_arguments(locals())
        self.paths, weights = sources(source)
        with remote.first_contact(first_contact_s):
            self.manifests: list[Manifest] = [read_manifest(p, storage_options) for p in self.paths]
        self.seq_len = seq_len = None if seq_len is None else int(seq_len)  # numpy integers as Python's
        self.shuffle, self.seed, self.shuffle_window = bool(shuffle), int(seed), int(shuffle_window)
        self.rank_arg, self.world_arg = (None if v is None else int(v) for v in (rank, world_size))
        self.position_ids, self.decode_once = bool(position_ids), bool(decode_once)
        self.index = SampleIndex(self.paths, self.manifests, weights, seq_len, self.shuffle, self.seed,
                                 self.shuffle_window)
        self._check_not_empty()
        self.storages = [Storage(p, cache_dir, cache_limit=cache_limit, storage_options=storage_options)
                         for p in self.paths]
        self._check_shards_present()
        self.reader = ShardReader(self.index, self.storages, self.decode_once)
        self.cursor = Cursor(self.seed, self.num_samples, seq_len, self.index.fingerprint)
        self.audit = None if audit is None else os.fspath(audit)
        self._audit_log: AuditLog | None = None  # made when this process first iterates the dataset itself
        self._audit_via = "start"

    def _check_not_empty(self) -> None:
        """A dataset that can yield no sample is a mistake: say why now, not after an empty epoch."""
        what = self.describe() + (f" (+{len(self.paths) - 1} more)" if len(self.paths) > 1 else "")
        if self.num_samples == 0:
            if self.seq_len:
                longest = max((s.tokens for _, s in self.shards), default=0)
                raise ConfigError(f"{what}: no sample of seq_len+1 = {self.seq_len + 1} tokens fits in a shard (the "
                                  f"largest holds {longest} tokens); lower seq_len or write larger shards")
            raise ConfigError(f"{what}: the dataset holds no document")
        _, world = self.rank_world()
        if self.num_samples < world:
            raise ConfigError(f"{what}: {self.num_samples} samples cannot give each of {world} ranks one; "
                              f"use fewer ranks{', or a shorter seq_len' if self.seq_len else ''}")

    def _check_shards_present(self) -> None:
        """A local dataset missing a shard file (a partial copy) is said now, not when an epoch reaches it: one
        listing per folder (a stat per shard would load a shared file system's metadata server, on every rank)."""
        listed: dict[str, set[str]] = {}
        for src, info in self.shards:
            storage = self.storages[src]
            if storage.remote:
                continue
            folder = os.path.join(storage.root, os.path.dirname(info.path))
            if folder not in listed:
                try:
                    listed[folder] = set(os.listdir(folder))
                except OSError:
                    listed[folder] = set()
            if os.path.basename(info.path) not in listed[folder]:
                storage.in_place(info)  # a one-line FormatError naming the missing file

    def describe(self) -> str:
        return f"{self.paths[0]}"

    # --- what the index knows -----------------------------------------------------------------------
    @property
    def tokenizer(self) -> TokenizerMeta:
        return self.index.tokenizer

    @property
    def shards(self) -> list[tuple[int, ShardInfo]]:
        """(source index, shard) of every shard, sources in order."""
        return self.index.shards

    @property
    def counts(self) -> np.ndarray:
        """Samples per shard."""
        return self.index.counts

    @property
    def dropped_tokens(self) -> int:
        """Tokens of shard tails too short for a sample (counted, not served)."""
        return self.index.dropped_tokens

    @property
    def streams(self) -> list[np.ndarray]:
        return self.index.streams

    @property
    def blend(self) -> Blend | None:
        return self.index.blend

    @property
    def fingerprint(self) -> str:
        return self.index.fingerprint

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size

    @property
    def eos_id(self) -> int:
        return self.tokenizer.eos_id

    @property
    def num_samples(self) -> int:
        """Samples in one epoch, all ranks together."""
        return self.index.num_samples

    def rank_world(self) -> tuple[int, int]:
        return rank_world(self.rank_arg, self.world_arg)

    def __len__(self) -> int:
        """This rank's samples in one epoch (the same on every rank, whatever the position)."""
        return self.num_samples // self.rank_world()[1]

    def order(self, stream: int = 0, epoch: int | None = None) -> EpochOrder:
        """The sample order of one stream's epoch (a pure function of seed, epoch and the manifest)."""
        return self.index.order(stream, self.epoch if epoch is None else epoch)

    def locate(self, ids: np.ndarray, epoch: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Global sample ids of an epoch (default: the current one) -> (shard index, sample index in the
        shard). Reads nothing and changes nothing."""
        shards, within, _ = self.index.locate(ids, self.epoch if epoch is None else epoch)
        return shards, within

    # --- the position: the cursor's -----------------------------------------------------------------
    @property
    def epoch(self) -> int:
        return self.cursor.epoch

    @property
    def consumed(self) -> int:
        """Global samples of the current epoch already served (all ranks together)."""
        return self.cursor.consumed

    def plan(self, batch_size: int = 1, drop_last: bool = True) -> BatchPlan:
        """This rank's batches from the current position to the end of the epoch."""
        return self.cursor.plan(*self.rank_world(), batch_size, drop_last)

    def set_epoch(self, epoch: int) -> None:
        self.cursor.set_epoch(epoch)
        self._audit_via = "set_epoch"

    def loader_state(self) -> LoaderState:
        return self.cursor.state()

    def state_dict(self) -> dict[str, Any]:
        """The position (epoch, global samples consumed) and what it is valid for: small, JSON-serialisable."""
        if self._audit_log is not None:
            self._audit_log.flush()  # the audit's records up to this state are on disk
        return self.cursor.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.cursor.load_state_dict(state)
        self._audit_via = "load_state_dict"

    # --- the contract: filling batches ----------------------------------------------------------------
    def batch_layout(self, batch_size: int) -> BatchLayout:
        """Shapes and dtypes of a packed batch (what `fill` writes and a slot of the hand-off ring holds)."""
        if self.seq_len is None:
            raise ConfigError("whole-document batches have no fixed layout; set seq_len")
        fields = ["input_ids", "labels"] + (["position_ids"] if self.position_ids else [])
        return {k: ((batch_size, self.seq_len), np.int64) for k in fields}

    def fill(self, ids: np.ndarray, out: dict[str, np.ndarray], epoch: int | None = None) -> FillReport:
        """Write the packed samples of global sample `ids` of `epoch` (default: the current one) into the
        first rows of `out` (arrays of `batch_layout`); reports the seconds of each stage (`stages.STAGES`)
        and this process's decoded-cache counts (`stages.TOTALS`)."""
        opening = OpenTimes()
        t0 = time.perf_counter()
        shard_ids, within, windows = self.index.locate(ids, self.epoch if epoch is None else epoch)
        self.reader.advance(windows)
        t1 = time.perf_counter()
        samples = self.reader.samples(shard_ids, within, opening)  # opens shards (fetch), decompresses (read)
        t2 = time.perf_counter()
        self.reader.pack(samples, shard_ids, within, out)
        t3 = time.perf_counter()
        self.reader.evict_finished()
        waited = opening.fetch + opening.decode
        seconds = {"shuffle": t1 - t0, "fetch": opening.fetch, "decode": opening.decode,
                   "read": max(t2 - t1 - waited, 0.0), "collate": t3 - t2}
        return FillReport(seconds, self.reader.counts())

    def documents(self, ids: np.ndarray, epoch: int | None = None) -> dict[str, Any]:
        """Whole documents of global sample `ids` (no `seq_len`): {"tokens": [LongTensor], "id": [str]}."""
        shard_ids, within, windows = self.index.locate(ids, self.epoch if epoch is None else epoch)
        self.reader.advance(windows)
        docs = self.reader.documents(shard_ids, within)
        self.reader.evict_finished()
        return docs

    def close(self, wait: bool = True) -> None:
        """Let go of this process's open shards and cache locks now (the dataset stays usable: it opens
        them again when read); `wait=False` does not wait for the work-ahead (a worker about to exit)."""
        self.reader.close(wait)

    # --- torch's faces ----------------------------------------------------------------------------
    def __getitem__(self, i: int) -> dict[str, Any]:
        """Sample `i` of the dataset in stored order (shards in manifest order, unshuffled), 0 <= i < num_samples."""
        if self.blend is not None:
            raise ConfigError("a mix has no stored order to index: index one source's StreamingDataset instead")
        if isinstance(i, bool) or not isinstance(i, (int, np.integer)):
            raise TypeError(f"StreamingDataset indices are integers, got {type(i).__name__}")
        n = self.num_samples
        if not -n <= i < n:
            raise IndexError(f"sample {i} is outside [0, {n})")
        k, j = self.index.stored(int(i) % n)
        if self.seq_len is None:
            doc_id, tokens = self.reader.shard(k).document(j)
            sample = {"tokens": torch.from_numpy(tokens.astype(np.int64)), "id": doc_id}
        else:
            shard_ids, within = np.array([k]), np.array([j])
            out = {name: np.empty(shape, dtype) for name, (shape, dtype) in self.batch_layout(1).items()}
            self.reader.pack(self.reader.samples(shard_ids, within, OpenTimes()), shard_ids, within, out)
            sample = {name: torch.from_numpy(v[0]) for name, v in out.items()}
        self.reader.bound(self.shuffle_window)  # random access keeps a bounded set of shards open
        return sample

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """This rank's samples one by one from the current position; the cursor follows what is yielded.
        In a torch DataLoader worker: this worker's share, untracked (see the class docstring)."""
        info = get_worker_info()
        if info is not None:
            self.cursor.mark_untracked()
        plan = self.plan(batch_size=1)
        if info is not None:
            samples = self._samples(plan, range(info.id, plan.num_batches, info.num_workers))
        else:
            samples = self.cursor.follow(plan, self._samples(plan, range(plan.num_batches)))
        yield from samples if self.audit is None else self._audited(plan, samples, info)

    def _audited(self, plan: BatchPlan, samples: Iterator[dict[str, Any]], info: Any) -> Iterator[dict[str, Any]]:
        """`samples` recorded in the audit as they are yielded (a torch DataLoader worker: in a file of its own)."""
        worker, workers = (None, 0) if info is None else (info.id, info.num_workers)
        if self._audit_log is None or not self._audit_log.mine(worker):  # a worker's copy has none of its own
            self._audit_log = AuditLog(self.audit, self.cursor.state().to_dict(), (*self.rank_world(), workers),
                                       batch_size=1, drop_last=True, source=type(self).__name__, worker=worker)
        via, self._audit_via = self._audit_via, None
        walk = self._audit_log.walk(plan, via, worker or 0, max(workers, 1))
        return self._audit_log.track(walk, samples)

    def _samples(self, plan: BatchPlan, batches: range) -> Iterator[dict[str, Any]]:
        for b in batches:
            ids = plan.sample_ids(b)
            if self.seq_len is None:
                yield {k: v[0] for k, v in self.documents(ids, plan.epoch).items()}
            else:
                out = {name: np.empty(shape, dtype) for name, (shape, dtype) in self.batch_layout(1).items()}
                self.fill(ids, out, plan.epoch)
                yield {k: torch.from_numpy(v[0]) for k, v in out.items()}


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
    "audit": (lambda v: v is None or isinstance(v, (str, os.PathLike)) and str(v).strip() != "",
              "a folder for the data-order audit, or None"),
}


def _check_arguments(given: dict[str, Any]) -> None:
    """One `ConfigError` line for a StreamingDataset argument that cannot work, before any file is read."""
    for name, (acceptable, want) in _ARGUMENTS.items():
        if not acceptable(given[name]):
            raise ConfigError(f"StreamingDataset: {name} must be {want}, got {given[name]!r}")
    rank, world = given["rank"], given["world_size"]
    if (rank is None) != (world is None):  # the missing one taken as 0 or 1 would give every process rank 0
        given_one, missing = ("world_size", "rank") if rank is None else ("rank", "world_size")
        raise ConfigError(f"StreamingDataset: {given_one}={given[given_one]} without {missing}: pass both (this "
                          f"process's data-parallel rank and the number of ranks), or neither to take "
                          f"torch.distributed's")
    if rank is not None and world is not None and rank >= world:
        raise ConfigError(f"StreamingDataset: rank {rank} is outside world_size {world} (ranks are 0 to {world - 1})")
