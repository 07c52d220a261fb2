"""What to change: plain-language advice from a profiled configuration's figures."""

from __future__ import annotations

import math
import os
from typing import Any

from dataflow.profiling.monitor import judged

STAGE_ADVICE = {
    "read": "reading and decompressing record batches dominates: add workers, or write the shards with lighter "
            "compression (`dataflow tokenize --compression none`, or a lower --zstd-level)",
    "fetch": "opening/downloading shards dominates: the shards are remote or the cache is cold; warm the cache "
             "($DATAFLOW_CACHE), use a faster store, or larger shards",
    "shuffle": "locating samples in the epoch order dominates: lower --shuffle-window (data.shuffle_window in a "
               "trainer config, StreamingDataset(shuffle_window=...) in code)",
    "collate": "packing samples into batches dominates: add workers (position_ids cost extra work)",
    "h2d": "the host-to-device copy dominates: pin memory (StreamingDataLoader(pin_memory=True)) and keep "
           "--depth >= 2",
}
SLOW_HEADROOM = 2.0  # below this capacity / need, the slowest stage is worth naming
FETCH_CPU_SHARE = 0.10  # main-process CPU in next() above this share of a step is worth a remark


def usable_cores() -> int:
    """CPU cores this process may run on (its affinity, which containers and Slurm set), at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def workers_needed(workers: int, capacity: float, needed: float, margin: float = 1.25) -> int:
    """Workers to reach `needed` batches/s at `margin`, scaling from the measured capacity of `workers`."""
    if capacity <= 0:
        return max(workers, 1) * 2
    return max(1, math.ceil(max(workers, 1) * needed * margin / capacity))


def advise(result: dict[str, Any]) -> list[str]:
    """Advice lines for one configuration's result (`session.run_config`)."""
    run, s = result["run"], result["settings"]
    stages = result.get("stages") or {}
    dominant = stages.get("dominant")
    headroom = result.get("headroom")
    cap = (result.get("capacity") or {}).get("batches_per_s")
    needed = result.get("needed_batches_per_s")
    w = s["num_workers"]
    out = []
    seen = judged(run)  # the steady state, past the warm-up, when there is one
    where = " in the steady state" if seen is not run else ""
    if run["verdict"] == "compute-bound":
        out.append(f"not input-bound: the consumer waited {seen['data_wait_pct']:.2f}% of the time{where}.")
        if headroom is not None and w > 1 and cap and needed:
            fewer = workers_needed(w, cap, needed, margin=1.5)
            if fewer < w:
                out.append(f"the loader has {headroom:.1f}x headroom; num_workers={fewer} would likely still keep "
                           f"up (check with --sweep num_workers={fewer},{w}).")
    else:
        out.append(f"{run['verdict']}: the consumer waited {seen['data_wait_pct']:.1f}% of wall time for data"
                   f"{where} (p99 {seen['wait_p99_ms']:.1f} ms per batch).")
        if headroom is not None and headroom < 1.0 and cap and needed:
            out.append(_more_workers(w, cap, needed, usable_cores()))
        elif headroom is not None:
            out.append(f"the loader keeps up on average ({headroom:.1f}x headroom) but batches arrive unevenly: "
                       f"raise depth or prefetch_factor (--sweep depth={s['depth']},{2 * s['depth']}).")
        if dominant in STAGE_ADVICE and (headroom is None or headroom < SLOW_HEADROOM):
            out.append(STAGE_ADVICE[dominant] + ".")
    step_ms = 1e3 * run.get("step_host_s", 0.0)
    cpu_ms = run.get("fetch_cpu_ms_per_batch", 0.0)
    if step_ms > 0 and cpu_ms > FETCH_CPU_SHARE * step_ms:
        where = "collation runs in the training process (num_workers=0)" if w == 0 else \
            "the training process spends it receiving batches"
        out.append(f"fetching costs the training process {cpu_ms:.2f} ms of CPU per batch "
                   f"({100 * cpu_ms / step_ms:.0f}% of a step): {where}.")
    return out


def _more_workers(workers: int, capacity: float, needed: float, cores: int) -> str:
    """How many workers would keep up, within this machine's cores; past them, say that cores are missing."""
    more = workers_needed(workers, capacity, needed)
    head = f"the loader delivers {capacity:.1f} batches/s, the step needs {needed:.1f}"
    if more <= cores:
        return f"{head}: try --num-workers {more} (--sweep num_workers={workers},{more})."
    reach = capacity * cores / max(workers, 1)
    text = (f"{head}; even one worker per core ({cores}, this machine's) would reach about {reach:.1f}: "
            f"the loader needs more CPU than this machine has")
    if workers < cores:
        text += f"; --num-workers {cores} gets closest (--sweep num_workers={workers},{cores})"
    return text + "."
