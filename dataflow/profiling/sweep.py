"""`--sweep num_workers=0,1,2 depth=1,2,4`: measure each configuration, recommend the cheapest that keeps up.

Cheapest means: data wait below `TARGET_PCT` of wall time, then fewest workers, then smallest
prefetch depth, then smallest prefetch_factor, then least estimated host memory.
"""

from __future__ import annotations

import itertools
from typing import Any, Callable

from dataflow.errors import ConfigError
from dataflow.profiling.consumers import Consumer
from dataflow.profiling.monitor import judged
from dataflow.profiling.session import RunSettings, make_loader, run_config, with_settings

TARGET_PCT = 1.0
KEYS = {"num_workers": 0, "workers": 0, "depth": 1, "prefetch_factor": 1}  # sweepable setting -> minimum
ALIASES = {"workers": "num_workers"}


def parse_sweep(items: list[str]) -> dict[str, list[int]]:
    """`["num_workers=0,1,2", "depth=1,2"]` -> {"num_workers": [0, 1, 2], "depth": [1, 2]}."""
    out: dict[str, list[int]] = {}
    for item in items:
        key, sep, values = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in KEYS:
            raise ConfigError(f"--sweep {item!r}: write KEY=V1,V2,... with KEY one of num_workers, depth, "
                              f"prefetch_factor")
        try:
            vals = sorted({int(v) for v in values.split(",") if v.strip()})
        except ValueError:
            raise ConfigError(f"--sweep {item!r}: values must be whole numbers") from None
        if not vals or vals[0] < KEYS[key]:
            raise ConfigError(f"--sweep {item!r}: give values >= {KEYS[key]}")
        out[ALIASES.get(key, key)] = vals
    return out


def _cost(r: dict[str, Any]) -> tuple:
    s = r["settings"]
    return (s["num_workers"], s["depth"], s["prefetch_factor"], r["memory_estimate_mb"])


def recommend(results: list[dict[str, Any]], target_pct: float = TARGET_PCT) -> dict[str, Any]:
    """The cheapest result below `target_pct` data wait; else the one that waited least, flagged."""
    ok = [r for r in results if judged(r["run"])["data_wait_pct"] < target_pct]
    if ok:
        best = min(ok, key=_cost)
        why = (f"cheapest configuration below {target_pct:g}% data wait (fewest workers, then smallest depth, "
               f"then least memory)")
    else:
        best = min(results, key=lambda r: (judged(r["run"])["data_wait_pct"], _cost(r)))
        why = (f"no configuration got below {target_pct:g}% data wait; this one waited least. Try more workers "
               f"or a faster stage (see the breakdown)")
    s = best["settings"]
    if s["num_workers"] == 0:
        why += ("; with num_workers=0 the batches are built by a thread of the training process, which a "
                "sleeping step leaves idle but a real Python step competes with: confirm with --config")
    return {"settings": {k: s[k] for k in ("num_workers", "depth", "prefetch_factor")},
            "data_wait_pct": judged(best["run"])["data_wait_pct"], "met_target": bool(ok), "target_pct": target_pct,
            "why": why}


def sweep(base: RunSettings, grid: dict[str, list[int]], consumer: Consumer,
          progress: Callable[[str], None] | None = None, loader_factory: Callable[..., Any] = make_loader
          ) -> dict[str, Any]:
    """Run every combination of `grid` over `base` against `consumer`; rows and the recommendation."""
    keys = list(grid)
    results = []
    combos = list(itertools.product(*(grid[k] for k in keys)))
    for i, values in enumerate(combos):
        s = with_settings(base, **dict(zip(keys, values)))
        if progress is not None:
            progress(f"sweep {i + 1}/{len(combos)}: " + " ".join(f"{k}={v}" for k, v in zip(keys, values)))
        results.append(run_config(s, consumer, capacity=False, keep_timeline=False, loader_factory=loader_factory))
    rows = [{**{k: r["settings"][k] for k in ("num_workers", "depth", "prefetch_factor")},
             "data_wait_pct": judged(r["run"])["data_wait_pct"], "wait_p99_ms": judged(r["run"])["wait_p99_ms"],
             "batches_per_s": judged(r["run"])["batches_per_s"], "memory_estimate_mb": r["memory_estimate_mb"],
             "dominant_stage": r["stages"]["dominant"]} for r in results]
    return {"grid": grid, "rows": rows, "recommendation": recommend(results)}
