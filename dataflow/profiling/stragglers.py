"""Which ranks are stragglers, and the line that names one (the fleet view's and the live monitor's rule).

A straggler is a rank whose steady-state data-wait share is above 10% of its wall time and at least `k`
times the median of the other ranks' (default k = 2): it holds every other rank of a step back.
"""

from __future__ import annotations

import statistics
from typing import Any

STRAGGLER_K = 2.0
STRAGGLER_MIN_SHARE = 0.10
ADVICE = {"fetch": "shards arrive slowly: a faster or closer store, a larger cache, or more fetch-ahead",
          "decode": "decompression: decode_once=True, or more workers on this node",
          "read": "reading samples: more workers, or a larger shuffle_window's shards kept open",
          "collate": "packing batches: more workers", "shuffle": "the epoch order: more workers",
          "h2d": "host-to-device copies: pin_memory=True with DevicePrefetcher"}


def stragglers_of(ranks: list[dict[str, Any]], k: float = STRAGGLER_K) -> list[int]:
    """Ranks whose `wait_share` is above 10% and at least k times the median of the other ranks'."""
    found = []
    for r in ranks:
        others = [o["wait_share"] for o in ranks if o is not r]
        median = statistics.median(others) if others else 0.0
        if r["wait_share"] > STRAGGLER_MIN_SHARE and r["wait_share"] >= k * median:
            found.append(r["rank"])
    return found


def straggler_line(r: dict[str, Any]) -> str:
    """`STRAGGLER rank 3 on node7: data wait 41.0%, slowest stage fetch: <what to change>`."""
    return (f"STRAGGLER rank {r['rank']} on {r['host']}: data wait {100 * r['wait_share']:.1f}%, slowest stage "
            f"{r['slowest_stage']}: {ADVICE.get(r['slowest_stage'] or '', 'look at its loader figures')}")
