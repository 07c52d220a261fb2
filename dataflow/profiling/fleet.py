"""`dataflow profile --fleet RUN_DIR`: every rank's figures (`rank-R.jsonl`, `fleet_log.py`) in one view.

Per rank, the steady state (intervals that begin after the warm-up) gives its data-wait share of wall time,
its step time and the loader stage that grew most (its slowest stage); per host, the ranks' mean share.
A straggler is a rank whose steady wait share is at least `k` times the median of the other ranks' and
above 10% of its wall time. Under data parallelism a step is as slow as its slowest rank, so the job is
judged by its most-waiting rank: input-bound when that rank is (`monitor.verdict`).
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from dataflow.errors import ConfigError
from dataflow.profiling.monitor import verdict
from dataflow.profiling.stragglers import STRAGGLER_K, STRAGGLER_MIN_SHARE, straggler_line, stragglers_of



def read_intervals(run_dir: str) -> list[tuple[dict[str, Any], list[dict[str, Any]]]]:
    """Each rank's header and interval records, by rank (a line cut short by a kill is skipped; a rank
    that restarted counts from its latest start)."""
    if not os.path.isdir(run_dir):
        raise ConfigError(f"{run_dir}: no such folder; pass the run_dir given to StarvationMonitor")
    files = sorted(glob.glob(os.path.join(run_dir, "rank-*.jsonl")))
    if not files:
        raise ConfigError(f"{run_dir}: holds no rank-R.jsonl file; pass the run_dir given to StarvationMonitor")
    out = []
    for name in files:
        header, intervals = None, []
        with open(name, "rb") as f:
            for line in f:
                try:
                    record = json.loads(line)
                except ValueError:
                    continue
                if record.get("kind") == "rank":
                    header, intervals = record, []
                elif record.get("kind") == "interval" and header is not None:
                    intervals.append(record)
        if header is not None:
            out.append((header, intervals))
    return sorted(out, key=lambda hi: hi[0]["rank"])


def read_ranks(run_dir: str) -> list[dict[str, Any]]:
    """Each rank's figures (`_rank_figures`), by rank."""
    return [_rank_figures(h, i) for h, i in read_intervals(run_dir)]


def _rank_figures(header: dict[str, Any], intervals: list[dict[str, Any]]) -> dict[str, Any]:
    steady = [i for i in intervals if not i["warmup"]]
    judged = steady or intervals
    wall, wait = sum(i["wall_s"] for i in judged), sum(i["wait_s"] for i in judged)
    steps = sum(i["steps"][1] - i["steps"][0] for i in judged)
    base = ([i for i in intervals if i["warmup"]] or [{"stages": {}}])[-1]["stages"] if steady else {}
    last = intervals[-1]["stages"] if intervals else {}
    grown = {k: v - base.get(k, 0.0) for k, v in last.items()}
    slowest = max(grown, key=grown.get) if grown and max(grown.values()) > 0 else None
    return {"rank": header["rank"], "host": header["host"], "steps": intervals[-1]["steps"][1] if intervals else 0,
            "steady_steps": steps if steady else 0, "wait_share": wait / wall if wall > 0 else 0.0,
            "step_s": sum(i["step_s"] for i in judged) / steps if steps else None, "slowest_stage": slowest,
            "stage_s": {k: round(v, 4) for k, v in grown.items()}, "steady": bool(steady)}


def fleet_report(run_dir: str, k: float = STRAGGLER_K) -> dict[str, Any]:
    """The fleet view: `ranks`, `nodes`, `stragglers` (rank numbers), `verdict` (see the module docstring)."""
    ranks = read_ranks(run_dir)
    stragglers = stragglers_of(ranks, k)
    nodes: dict[str, list[dict[str, Any]]] = {}
    for r in ranks:
        nodes.setdefault(r["host"], []).append(r)
    worst = max(ranks, key=lambda r: r["wait_share"])
    return {"run_dir": run_dir, "ranks": ranks, "stragglers": stragglers,
            "nodes": [{"host": h, "ranks": [r["rank"] for r in rs],
                       "wait_share": sum(r["wait_share"] for r in rs) / len(rs)} for h, rs in sorted(nodes.items())],
            "slowest_rank": worst["rank"], "job_wait_share": worst["wait_share"],
            "verdict": verdict(100 * worst["wait_share"]), "straggler_rule": f"steady wait share >= {k:g} x the "
            f"median of the other ranks' and > {100 * STRAGGLER_MIN_SHARE:g}%"}


def format_fleet(report: dict[str, Any]) -> str:
    lines = [f"fleet of {len(report['ranks'])} ranks in {report['run_dir']}: the job is {report['verdict']} (its "
             f"most-waiting rank, {report['slowest_rank']}, waits {100 * report['job_wait_share']:.1f}% of its steady "
             f"state; a step is as slow as its slowest rank)"]
    for r in sorted(report["ranks"], key=lambda r: -r["wait_share"]):
        step = f", step {1e3 * r['step_s']:.1f} ms" if r["step_s"] else ""
        lines.append(f"  rank {r['rank']} on {r['host']}: data wait {100 * r['wait_share']:.1f}%{step}, "
                     f"{r['steps']} steps, slowest stage {r['slowest_stage'] or '-'}"
                     + ("" if r["steady"] else " (warm-up only)"))
    for n in report["nodes"]:
        lines.append(f"  node {n['host']}: ranks {', '.join(map(str, n['ranks']))}, mean data wait "
                     f"{100 * n['wait_share']:.1f}%")
    by_rank = {r["rank"]: r for r in report["ranks"]}
    lines += [straggler_line(by_rank[s]) for s in report["stragglers"]]
    if not report["stragglers"]:
        lines.append(f"no straggler ({report['straggler_rule']})")
    return "\n".join(lines)
