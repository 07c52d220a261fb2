"""`dataflow profile`: the loader's capacity alone, then against a consumer, with the stage breakdown.

One configuration runs one `StreamingDataLoader` (persistent workers, epochs cycled) behind one
`DevicePrefetcher`: `warmup` batches (startup, not counted), `batches` with no consumer (capacity:
batches/s the pipeline delivers), `warmup` more at the consumer's pace (the capacity phase drained
the queues), then `batches` against the consumer under a `StarvationMonitor`.
The loader's `stage_hook` records each batch's stages and counts from inside the workers (`recorder.py`),
so the report can say which stage and which worker the time goes to; the monitor reads the rest through
the `StageFigures` contract.
"""

from __future__ import annotations

import tempfile
import time
from dataclasses import asdict, dataclass, replace
from itertools import islice
from typing import Any, Callable, Iterator

from dataflow.errors import ConfigError
from dataflow.profiling import advice
from dataflow.profiling.consumers import Consumer, idle
from dataflow.profiling.monitor import StarvationMonitor, judged
from dataflow.profiling.recorder import (StageRecorder, TimedUpstream, decode_counts, per_track_seconds,
                                        read_stage_events)
from dataflow.profiling.breakdown import breakdown, merge_seconds


@dataclass(frozen=True)
class RunSettings:
    """One loader configuration to measure."""

    data: str
    batch_size: int
    seq_len: int
    num_workers: int = 2
    depth: int = 2
    prefetch_factor: int = 2
    batches: int = 100
    warmup: int | None = None  # default: enough to start every worker and fill the queues
    device: str = "auto"
    seed: int = 0
    shuffle_window: int | None = None  # shards shuffled together (None: StreamingDataset's default)

    def check(self) -> None:
        for name in ("batch_size", "seq_len", "depth", "prefetch_factor", "batches"):
            if getattr(self, name) < 1:
                raise ConfigError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.shuffle_window is not None and self.shuffle_window < 1:
            raise ConfigError(f"--shuffle-window must be at least 1, got {self.shuffle_window}")
        if self.num_workers < 0:
            raise ConfigError(f"--num-workers must be >= 0, got {self.num_workers}")

    @property
    def warmup_batches(self) -> int:
        return self.warmup if self.warmup is not None else 2 + self.num_workers * self.prefetch_factor + self.depth


def resolve_device(device: str) -> str:
    import torch

    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: no CUDA device here")
    return device


def held_batches(depth: int) -> int:
    """The loader's `held_batches` behind a prefetcher of `depth`: what it holds, or the loader's default if more."""
    from dataflow.loading.loader import HELD_BATCHES, held_after_reserve
    from dataflow.loading.prefetch import held_upstream

    return held_after_reserve(HELD_BATCHES, held_upstream(depth))


def memory_estimate_mb(s: RunSettings, manifest_tokens: int, shards: int, shuffle_window: int, cuda: bool) -> float:
    """Rough host memory of a configuration: slot ring, pinned copies, decompressed shards per reader (the ring
    and the prefetcher's copies counted by their own sizing rules, for an input_ids + labels batch)."""
    from dataflow.loading.prefetch import staging_slots
    from dataflow.loading.ring import slot_bytes, slots_per_worker

    field = ((s.batch_size, s.seq_len), "int64")
    slot = slot_bytes({"input_ids": field, "labels": field})
    per_worker = slots_per_worker(s.prefetch_factor, held_batches(s.depth), s.num_workers) if s.num_workers else 0
    worker_slots = per_worker * s.num_workers * slot
    pinned = staging_slots(s.depth) * slot if cuda else 0
    readers = max(s.num_workers, 1)
    shard_bytes = 2 * manifest_tokens / max(shards, 1) * min(shuffle_window, max(shards, 1))
    return (worker_slots + pinned + readers * shard_bytes) / 1e6


def make_loader(s: RunSettings, **options: Any) -> Any:
    """The profiler's own loader for `s` (a training program's `ProfileTarget` may build its own)."""
    from dataflow.loading.dataset import StreamingDataset
    from dataflow.loading.loader import StreamingDataLoader

    shuffle = {} if s.shuffle_window is None else {"shuffle_window": s.shuffle_window}
    ds = StreamingDataset(s.data, seq_len=s.seq_len, seed=s.seed, **shuffle)
    return StreamingDataLoader(ds, batch_size=s.batch_size, num_workers=s.num_workers, **options)


def run_config(s: RunSettings, consumer: Consumer, capacity: bool = True, keep_timeline: bool = True,
               loader_factory: Callable[..., Any] = make_loader) -> dict[str, Any]:
    """Measure one configuration: startup, capacity (optional), then the run against `consumer`."""
    from dataflow.loading.prefetch import DevicePrefetcher

    s.check()
    device = resolve_device(s.device)
    s = replace(s, device=device)
    with tempfile.TemporaryDirectory(prefix="dataflow-profile-") as folder:
        loader = loader_factory(s, persistent_workers=True, prefetch_factor=s.prefetch_factor,
                                held_batches=held_batches(s.depth), pin_memory=device.startswith("cuda"), cycle=True,
                                stage_hook=StageRecorder(folder))
        ds = loader.dataset
        timed = TimedUpstream(loader)  # small datasets wrap around: the loader cycles through epochs
        prefetcher = DevicePrefetcher(timed, device=device, depth=s.depth, pinned=loader.pinned)
        try:
            t0 = time.perf_counter()
            it = iter(prefetcher)
            first = next(it)
            startup = time.perf_counter() - t0
            cap = None
            if capacity:  # ramp up with no consumer, measure; then refill the queues at the consumer's pace
                for _ in islice(it, s.warmup_batches - 1):
                    pass
                cap = _phase(it, idle(), s.batches, (loader, prefetcher, timed), folder)
                consumer.step(next(it))
            else:
                consumer.step(first)
            for batch in islice(it, s.warmup_batches - 1):
                consumer.step(batch)
            run = _phase(it, consumer, s.batches, (loader, prefetcher, timed), folder)
        finally:
            prefetcher.close()
            loader.close()
        shards, tokens = len(ds.shards), sum(info.tokens for _, info in ds.shards)
        counts = decode_counts(read_stage_events(folder))
    out: dict[str, Any] = {
        "settings": {**asdict(s), "device": device, "warmup": s.warmup_batches},
        "consumer": consumer.description,
        "startup_s": startup,
        "decode": {**counts,  # zstd shards decoded once per machine into the cache
                   "ms_per_shard": 1e3 * counts["decode_cpu_s"] / counts["shards_decoded"]
                   if counts["shards_decoded"] else None},
        "memory_estimate_mb": memory_estimate_mb(s, tokens, shards, ds.shuffle_window, device.startswith("cuda")),
        "run": run["summary"],
        "stages": run["stages"],
    }
    if cap is not None:  # the steady state's figures, past the monitor's warm-up, where there is one
        cs = judged(cap["summary"])
        out["capacity"] = {"batches_per_s": cs["batches_per_s"], "tokens_per_s": cs["tokens_per_s"],
                           "wait_p50_ms": cs["wait_p50_ms"], "stages": cap["stages"]}
    step_s = judged(run["summary"])["step_host_s"]
    if step_s > 0:
        out["needed_batches_per_s"] = 1.0 / step_s
        if cap is not None and out["capacity"]["batches_per_s"] > 0:
            out["headroom"] = out["capacity"]["batches_per_s"] * step_s
    if keep_timeline:
        out["_timeline"], out["_stage_events"], out["_upstream"] = run["timeline"], run["events"], run["upstream"]
    out["advice"] = advice.advise(out)
    return out


def _phase(it: Iterator[Any], consumer: Consumer, n: int, parts: tuple[Any, Any, TimedUpstream], folder: str
           ) -> dict[str, Any]:
    """`n` batches of `it` under a fresh monitor; its summary, stage breakdown and trace material.
    `parts`: the loader, the prefetcher over it, and the `TimedUpstream` between them."""
    loader, prefetcher, timed = parts
    mon = StarvationMonitor()
    mon.attach(loader, prefetcher)
    up0 = len(timed.slices)
    t0 = time.perf_counter()
    for batch in islice(mon.wrap(it), n):
        with mon.step():
            consumer.step(batch)
    t1 = time.perf_counter()
    mon.close()
    summary = mon.summary()
    events = [e for e in read_stage_events(folder, since=t0) if e["t0"] < t1]
    tracks = per_track_seconds(events)
    stages = breakdown(merge_seconds(tracks.values()), len(events), tracks or None)
    probe = summary.pop("stages")
    h2d = next((r for r in (probe or {}).get("stages", []) if r["stage"] == "h2d"), None)
    if h2d is not None:
        stages = breakdown({**merge_seconds(tracks.values()), "h2d": h2d["seconds"]}, len(events), tracks or None)
    stages["batches_recorded"] = len(events)
    stages["loader_stage_seconds"] = {r["stage"]: r["seconds"] for r in (probe or {}).get("stages", [])}
    return {"summary": summary, "stages": stages, "timeline": mon.timeline(), "events": events,
            "upstream": [u for u in timed.slices[up0:] if u[1] < t1]}


def with_settings(s: RunSettings, **changes: Any) -> RunSettings:
    return replace(s, **changes)
