"""`ShardReader`: the shards one process has open, the work ahead of it, and what it lets go.

Each process that builds batches (the main process, or a loader worker with its own copy) has one.
It is told which shuffle window of each stream is current (`advance`): it then downloads/decodes
that window's shards and the next window's in the background (the "work-ahead", `storage.fetch_ahead`),
and, once a batch is read (`evict_finished`), closes shards outside the current windows: they are done
for the epoch. Opening a shard times itself into the caller's `OpenTimes`, never into the reader.
"""

from __future__ import annotations

import functools
import logging
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from dataflow import env
from dataflow.formats.arrow_ranges import PartialArrowShard
from dataflow.formats.shard_formats import CheckedShard
from dataflow.loading import decoded as decoded_mod
from dataflow.loading import ranged
from dataflow.loading.download import range_bytes
from dataflow.loading.index import CurrentWindows, SampleIndex
from dataflow.loading.shards import OpenShard, Ranged
from dataflow.errors import ConfigError
from dataflow.formats.manifest import ShardInfo
from dataflow.loading.storage import Storage

log = logging.getLogger(__name__)


@dataclass
class OpenTimes:
    """Seconds one call spent opening shards: `fetch` (download and open), `decode` (waiting for decoded copies)."""

    fetch: float = 0.0
    decode: float = 0.0


class ShardReader:
    """Open shards of one process, read by (shard index, sample index); see the module docstring."""

    def __init__(self, index: SampleIndex, storages: list[Storage], decode_once: bool):
        self.index, self.storages = index, storages
        # per source: (format, token itemsize) when its zstd shards are decoded once per machine, else None
        decoded = [(m.format, np.dtype(m.dtype).itemsize) if decode_once and m.compression == "zstd" else None
                   for m in index.manifests]
        self._decoded = decoded_mod.usable(storages, decoded)  # a read-only cache: decode here
        self._check_room()
        self._open: dict[int, OpenShard] = {}
        self._bounds: dict[tuple[int, int], np.ndarray] = {}  # doc boundaries of samples read from a closed shard
        self._heads: dict[int, bytes] = {}  # heads fetched together for shards about to be opened by ranges
        self._current: CurrentWindows = {}  # stream -> (its epoch, window) last read
        self._kept_key: tuple = ()
        self._ahead_key: tuple = ()

    def shard(self, k: int, times: OpenTimes | None = None) -> OpenShard:
        """Shard k, opened (downloaded, decoded) if it is not yet; the time that took goes into `times`. A remote
        zstd Arrow shard whose decoded copy is not here yet is read by ranges meanwhile (`_by_ranges`)."""
        shard = self._open.get(k)
        if shard is None:
            t0 = time.perf_counter()
            src, info = self.index.shards[k]
            m, storage = self.index.manifests[src], self.storages[src]
            by_ranges = self._by_ranges(k)
            if by_ranges is not None:
                shard = self._open[k] = OpenShard(storage.url(info), m.format, info, m.tokenizer.vocab_size, m.dtype,
                                                  name=storage.url(info), ranged=by_ranges)
                if times is not None:
                    times.fetch += time.perf_counter() - t0
                return shard
            t_decode = time.perf_counter()
            path, decoded = decoded_mod.path_to_read(storage, info, self._decoded[src], m.compression == "zstd")
            self._decoded[src] = decoded  # None from now on if the cache became unwritable
            waited = time.perf_counter() - t_decode if decoded else 0.0
            shard = self._open[k] = OpenShard(path, m.format, info, m.tokenizer.vocab_size, m.dtype,
                                              decoded_from=info.sha256 if decoded else None,
                                              name=storage.url(info))
            if times is not None:
                times.decode += waited
                times.fetch += time.perf_counter() - t0 - waited
        return shard

    def _by_ranges(self, k: int) -> Ranged | None:
        """A remote zstd Arrow shard's record batches by ranged GETs until its decoded copy is here (its head
        fetched now), or None: read it whole (local, another format, its copy here, a server without ranges,
        a shard without recorded ranges, DATAFLOW_WHOLE_SHARDS)."""
        src, info = self.index.shards[k]
        m, storage, decode = self.index.manifests[src], self.storages[src], self._decoded[src]
        head = self._heads.pop(k, None)
        if not self._rangeable(src, info):
            return None
        name = storage.url(info)
        try:
            contents = PartialArrowShard(head or storage.ranged.head(info), info.bytes, name,
                                         functools.partial(storage.ranged.read, info))
        except Exception as e:  # the whole shard's download retries, checks and says what is wrong
            log.debug("%s: not read by ranges (%s)", name, e)
            return None

        def whole() -> CheckedShard:
            path, self._decoded[src] = decoded_mod.path_to_read(storage, info, self._decoded[src], True)
            return CheckedShard(path, m.format, info, m.dtype, m.tokenizer.vocab_size, name,
                                info.sha256 if self._decoded[src] else None)

        return Ranged(contents, functools.partial(storage.decoded_ready, info, decode[0]), whole)

    def _rangeable(self, src: int, info: ShardInfo) -> bool:
        """Whether shard `info` is read by ranges until its decoded copy is here: a remote zstd Arrow shard whose
        download is itself ranged (over twice DATAFLOW_RANGE_BYTES), so that it keeps what the reader fetched; a
        smaller one comes in one GET, soon, and fetching its batches too would cost up to its size again."""
        m, storage, decode = self.index.manifests[src], self.storages[src], self._decoded[src]
        step = range_bytes()
        return bool(storage.remote and decode and m.format == "arrow" and step is not None and info.bytes > 2 * step
                    and not env.flag("DATAFLOW_WHOLE_SHARDS") and not storage.decoded_ready(info, decode[0]))

    def _check_room(self) -> None:
        """Refuse a cache_limit below what one shuffle window needs in the cache: every shard of a window is in
        use while it is read, so such a limit could only be passed (or the epoch's order bent to fit it). The
        need is the `shuffle_window` largest shards of each stream (a window of some epoch holds them)."""
        w = self.index.shuffle_window
        for src, storage in enumerate(self.storages):
            if storage.cache_limit is None or not (storage.remote or self._decoded[src]):
                continue
            need = 0
            for stream in self.index.streams:
                sizes = [self.storages[s].cache_bytes(info, self._decoded[s]) for s, info in
                         (self.index.shards[k] for k in stream.tolist())
                         if self.storages[s].cache_dir == storage.cache_dir and
                         (self.storages[s].remote or self._decoded[s])]
                need += sum(sorted(sizes)[-w:])
            if storage.cache_limit < need:
                what = "decoded " if any(self._decoded) else ""
                raise ConfigError(f"{storage.root}: cache_limit {storage.cache_limit / 1e6:.1f} MB is below what one "
                                  f"shuffle window needs in the cache, {need / 1e6:.1f} MB (its {w} largest {what}"
                                  f"shards); raise cache_limit (DATAFLOW_CACHE_LIMIT) to at least that, or lower "
                                  f"shuffle_window")

    def advance(self, windows: CurrentWindows) -> None:
        """These shuffle windows are now current: fetch ahead what they need first (tier 0), then the next
        windows (tier 1, only with the bandwidth the current ones leave), and let go of anything else queued
        or held ahead (after a resume or a jump, what was ahead of the old position)."""
        self._current.update(windows)
        key = tuple(sorted(self._current.items()))
        if key == self._ahead_key:
            return
        self._ahead_key = key
        tiers = [[self.index.shards[k] for stream, (epoch, window) in self._current.items()
                  for k in self.index.window_shards(stream, epoch, window + step)] for step in (0, 1)]
        work_ahead(self.storages, tiers, self._decoded)

    def evict_finished(self) -> None:
        """Close open shards outside each stream's current shuffle window: they are done for this epoch."""
        key = tuple(sorted(self._current.items()))
        if key == self._kept_key:
            return
        self._kept_key = key
        keep = self._keep()
        for k in [k for k in self._open if k not in keep]:
            self._close_shard(k)

    def bound(self, limit: int) -> None:
        """Keep at most `limit` shards open, closing the oldest (random access, `ds[i]`)."""
        while len(self._open) > limit:
            self._close_shard(next(iter(self._open)))

    def _close_shard(self, k: int) -> None:
        self._open.pop(k, None)
        self.storages[self.index.shards[k][0]].release(self.index.shards[k][1])

    def close(self, wait: bool = True) -> None:
        """Let go of open shards and cache locks (`wait=False` does not wait for the work-ahead)."""
        self._open.clear()
        self._kept_key, self._ahead_key = (), ()
        for storage in self.storages:
            storage.close(wait)

    # --- reading ------------------------------------------------------------------------------------
    def samples(self, shard_ids: np.ndarray, within: np.ndarray, times: OpenTimes) -> list[np.ndarray]:
        """The tokens (seq_len + 1 of them) of each of the given samples. A batch that crosses into a new
        shuffle window reads the old window's samples first (they come first); each old shard is let go after
        its last sample here, before a new one is opened, so the cache never holds two windows in use."""
        L = self.index.seq_len
        ks, js = shard_ids.tolist(), within.tolist()
        keep = self._keep() if self._current else None  # None: random access (`ds[i]`), see `bound`
        last = {k: i for i, k in enumerate(ks)}
        self._bounds = {}
        self._fetch_by_ranges(ks, js, times)
        out = []
        for i, (k, j) in enumerate(zip(ks, js)):
            if keep is not None and k not in self._open:
                for done in [d for d in self._open if d not in keep and last.get(d, -1) < i]:
                    self._close_shard(done)  # an old window's shard this batch has finished with
            shard = self.shard(k, times)
            out.append(shard.token_run(j * L, L + 1))
            if keep is not None and k not in keep:  # closed before this batch is packed: keep what `pack` needs of it
                self._bounds[(k, j)] = shard.doc_boundaries(j * L, L)
        return out

    def _fetch_by_ranges(self, ks: list[int], js: list[int], times: OpenTimes) -> None:
        """Before a batch's samples are read: the heads of the shards it opens that are read by ranges, then
        the record batches it needs of every such shard, each set at once (a round trip each, not one a sample)."""
        new = sorted({k for k in ks if k not in self._open and self._rangeable(*self.index.shards[k])})
        if len(new) > 1:
            t0 = time.perf_counter()
            heads = ranged.at_once(lambda k: self.storages[self.index.shards[k][0]].ranged.head(
                self.index.shards[k][1]), new)
            self._heads.update((k, h) for k, h in zip(new, heads) if isinstance(h, bytes))
            times.fetch += time.perf_counter() - t0
        for k in new:
            self.shard(k, times)
        if not any(shard.by_ranges for shard in self._open.values()):
            return  # every shard whole (the rule once the window's copies are here): nothing to gather
        L = self.index.seq_len
        wanted = []
        for k, j in sorted(set(zip(ks, js))):
            shard = self._open.get(k)
            if shard is not None and shard.by_ranges:
                first, last = np.searchsorted(shard.token_starts, [j * L, j * L + L], side="right") - 1
                wanted += [(shard, i) for i in range(int(first), int(last) + 1) if i not in shard.batches]
        if len(wanted) > 1:
            t0 = time.perf_counter()
            ranged.at_once(lambda job: job[0].batch(job[1]), list(dict.fromkeys(wanted)))
            times.fetch += time.perf_counter() - t0

    def _keep(self) -> set[int]:
        """Shards of the current shuffle windows."""
        keep: set[int] = set()
        for stream, (epoch, window) in self._current.items():
            keep.update(self.index.window_shards(stream, epoch, window))
        return keep

    def pack(self, samples: list[np.ndarray], shard_ids: np.ndarray, within: np.ndarray,
             out: dict[str, np.ndarray]) -> None:
        """Samples' tokens -> the first rows of `out`: inputs, labels shifted by one, and position ids if asked."""
        L = self.index.seq_len
        if samples:
            stacked = np.stack(samples)  # one uint16 copy, then two casting copies into the buffer
            np.copyto(out["input_ids"][:len(samples)], stacked[:, :-1])
            np.copyto(out["labels"][:len(samples)], stacked[:, 1:])
        positions = out.get("position_ids")
        if positions is not None:
            for i, (k, j) in enumerate(zip(shard_ids.tolist(), within.tolist())):
                bounds = self._bounds.get((k, j))
                positions[i] = _positions(self.shard(k).doc_boundaries(j * L, L) if bounds is None else bounds, L)

    def documents(self, shard_ids: np.ndarray, within: np.ndarray) -> dict[str, Any]:
        """{"tokens": [LongTensor], "id": [str]} of the given documents."""
        docs = [self.shard(int(k)).document(int(j)) for k, j in zip(shard_ids, within)]
        return {"tokens": [torch.from_numpy(t.astype(np.int64)) for _, t in docs], "id": [d for d, _ in docs]}

    def counts(self) -> dict[str, float]:
        """This process's decoded-cache figures (`stages.TOTALS`), over all sources."""
        return {"shards_decoded": float(sum(s.decodes for s in self.storages)),
                "decode_hits": float(sum(s.decode_hits for s in self.storages)),
                "decode_cpu_s": sum(s.decode_s for s in self.storages)}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_open": {}, "_kept_key": (), "_ahead_key": (), "_bounds": {}, "_heads": {}}  # open shards: per process


def work_ahead(storages: list[Storage], tiers: list[list[tuple[int, ShardInfo]]],
               decode: list[tuple[str, int] | None]) -> None:
    """`Storage.work_ahead` of every source: `tiers` of `(source index, shard)` pairs in the order of need."""
    for src, storage in enumerate(storages):
        storage.work_ahead([[info for s, info in tier if s == src] for tier in tiers], decode=decode[src])


def _positions(boundaries: np.ndarray, length: int) -> np.ndarray:
    """Position ids 0,1,2,... restarting at each document boundary inside the sample."""
    pos = np.arange(length, dtype=np.int64)
    if boundaries.size:
        starts = np.concatenate([[0], boundaries])
        seg = np.searchsorted(starts, pos, side="right") - 1
        pos -= starts[seg]
    return pos
