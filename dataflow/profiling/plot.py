"""`--plot FILE.png`: wait vs compute per step, the wait histogram, and the stage breakdown (matplotlib)."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dataflow.errors import ConfigError
from dataflow.profiling.breakdown import STAGES
from dataflow.profiling.monitor import judged

COLORS = {"wait": "#d62728", "step": "#1f77b4", "fetch": "#9467bd", "read": "#ff7f0e", "shuffle": "#2ca02c",
          "collate": "#8c564b", "h2d": "#17becf"}


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--plot needs matplotlib: pip install 'dataflow-lm[plot]' (or pip install matplotlib)") \
            from None
    return plt


def plot_run(result: dict[str, Any], path: str) -> str:
    """Write the three-panel figure of one profiled configuration to `path` (PNG or any matplotlib format)."""
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ConfigError(f"--plot {path}: folder {folder} does not exist")
    plt = _pyplot()
    tl, run, st = result["_timeline"], result["run"], result["stages"]
    wait_ms, step_ms = 1e3 * tl["wait"], 1e3 * tl["step"]
    n = min(len(wait_ms), len(step_ms))
    fig, (a1, a2, a3) = plt.subplots(3, 1, figsize=(10, 11), gridspec_kw={"height_ratios": [3, 2, 2]})
    s = result["settings"]
    seen = judged(run)  # what the verdict judges: the steady state, past the warm-up, where there is one
    fig.suptitle(f"dataflow profile: {os.path.basename(str(s['data']).rstrip('/'))} - {run['verdict']}, "
                 f"data wait {seen['data_wait_pct']:.1f}%{' steady' if seen is not run else ''} (workers={s['num_workers']}, depth={s['depth']}, "
                 f"{result['consumer']})", fontsize=11)

    x = np.arange(n)
    a1.bar(x, step_ms[:n], width=1.0, color=COLORS["step"], label="step (compute)")
    a1.bar(x, wait_ms[:n], width=1.0, bottom=step_ms[:n], color=COLORS["wait"], label="wait for data")
    a1.set_xlabel("step")
    a1.set_ylabel("ms")
    a1.set_title("per step: compute and data wait (stacked)")
    a1.legend(loc="upper right")
    a1.set_xlim(-0.5, max(n, 1) - 0.5)

    nonzero = wait_ms[wait_ms > 0]
    if nonzero.size:
        lo, hi = max(nonzero.min(), 1e-3), max(nonzero.max(), 1e-2)
        bins = np.logspace(np.log10(lo), np.log10(hi * 1.01), 40)
        a2.hist(np.clip(wait_ms, lo, None), bins=bins, color=COLORS["wait"])
        a2.set_xscale("log")
    for q, style in (("wait_p50_ms", ":"), ("wait_p99_ms", "--")):
        if run[q] > 0:
            a2.axvline(run[q], color="k", linestyle=style, label=f"{q[5:8]} {run[q]:.2f} ms")
    a2.set_xlabel("wait per batch (ms, log scale)")
    a2.set_ylabel("batches")
    a2.set_title("wait per batch")
    a2.legend(loc="upper right")

    _stage_panel(a3, st)
    fig.tight_layout(rect=(0, 0, 1, 0.97))
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _stage_panel(ax: Any, st: dict[str, Any]) -> None:
    """Stacked horizontal bars: ms per batch of each stage, one bar per worker (or one in total)."""
    per = st.get("per_worker") or {}
    batches = max(st.get("batches_recorded") or 1, 1)
    names = [r["stage"] for r in st.get("stages", [])]
    order = [k for k in STAGES if k in names] + [k for k in names if k not in STAGES]
    if per:
        labels = list(per)
        rows = [{k: 1e3 * per[w].get(k, 0.0) / batches * len(per) for k in order} for w in labels]
        title = "where the loader's time goes: ms per batch it builds, per worker"
    else:
        labels = ["all"]
        rows = [{r["stage"]: r["ms_per_batch"] for r in st.get("stages", [])}]
        title = "where the loader's time goes: ms per batch"
    y = np.arange(len(labels))
    left = np.zeros(len(labels))
    for k in order:
        vals = np.array([r.get(k, 0.0) for r in rows])
        ax.barh(y, vals, left=left, color=COLORS.get(k, None), label=k)
        left += vals
    ax.set_yticks(y, labels)
    ax.invert_yaxis()
    ax.set_xlabel("ms per batch")
    ax.set_title(title)
    if order:
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.28), ncol=len(order), frameon=False)
    else:
        ax.text(0.5, 0.5, "no stage figures recorded", ha="center", va="center", transform=ax.transAxes)
