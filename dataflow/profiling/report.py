"""The profile report: a readable terminal table, and the JSON form (`--json`)."""

from __future__ import annotations

import json
from typing import Any


def public(report: dict[str, Any]) -> dict[str, Any]:
    """The report without its trace material (keys starting with `_`), JSON-ready."""
    def clean(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: clean(x) for k, x in v.items() if not str(k).startswith("_")}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        if hasattr(v, "item") and callable(v.item):
            return v.item()
        return v
    return clean(report)


def to_json(report: dict[str, Any]) -> str:
    return json.dumps(public(report), indent=1)


def _rate(per_s: float | None, unit: str) -> str:
    if per_s is None:
        return "-"
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if per_s >= scale:
            return f"{per_s / scale:.2f} {suffix}{unit}/s"
    return f"{per_s:.1f} {unit}/s"


def _gpu_line(g: dict[str, Any]) -> str:
    if not g.get("available"):
        return f"absent ({g.get('reason', 'no GPU')})"
    return (f"{g['util_mean_pct']:.0f}% mean, {g['util_min_pct']:.0f}% min over {g['samples']} samples "
            f"({g['device']}, {g['memory_used_gib']:.1f} GiB used)")


def format_stages(st: dict[str, Any], indent: str = "  ") -> list[str]:
    """The stage table: seconds (summed over workers), ms per batch, share; then per-worker seconds."""
    if not st or not st.get("recorded"):
        return [f"{indent}no stage figures recorded"]
    lines = [f"{indent}{'stage':<9} {'seconds':>8} {'ms/batch':>9} {'share':>6}  what"]
    for r in st["stages"]:
        mark = "  <- dominant" if r["stage"] == st["dominant"] else ""
        lines.append(f"{indent}{r['stage']:<9} {r['seconds']:>8.3f} {r['ms_per_batch']:>9.2f} "
                     f"{r['share_pct']:>5.1f}%  {r['what']}{mark}")
    per = st.get("per_worker") or {}
    if len(per) > 1 or (per and not next(iter(per)).startswith("main")):
        names = [r["stage"] for r in st["stages"] if r["stage"] != "h2d"]
        lines.append(f"{indent}per worker (s): " + "  ".join(
            f"{w}: " + " ".join(f"{k} {v.get(k, 0.0):.3f}" for k in names) for w, v in per.items()))
    if "h2d" not in {r["stage"] for r in st["stages"]}:
        lines.append(f"{indent}h2d: not recorded (on CPU there is no copy; on CUDA the monitor's copy wait covers it)")
    return lines


def format_run(r: dict[str, Any]) -> list[str]:
    """One configuration's figures as table lines."""
    s, run = r["settings"], r["run"]
    lines = [f"  settings        num_workers={s['num_workers']} depth={s['depth']} "
             f"prefetch_factor={s['prefetch_factor']} device={s['device']}; first batch after {r['startup_s']:.2f} s"]
    d = r.get("decode") or {}
    if d.get("shards_decoded") or d.get("decode_hits"):
        per = f", {d['ms_per_shard']:.0f} ms each" if d.get("ms_per_shard") else ""
        lines.append(f"  decoded cache   {d['shards_decoded']} zstd shard(s) decoded{per}; {d['decode_hits']} "
                     f"shard opening(s) found the decoded copy ready (one copy per machine, shared by "
                     f"every worker and rank)")
    if "capacity" in r:
        c = r["capacity"]
        lines.append(f"  capacity        {c['batches_per_s']:.1f} batches/s, {_rate(c['tokens_per_s'], 'tokens')} "
                     f"with no consumer")
    if "needed_batches_per_s" in r:
        head = f"; headroom {r['headroom']:.2f}x" if "headroom" in r else ""
        lines.append(f"  consumer needs  {r['needed_batches_per_s']:.1f} batches/s ({r['consumer']}){head}")
    lines += [
        f"  data wait       {run['data_wait_pct']:.2f}% of wall time ({run['data_wait_s']:.3f} s of "
        f"{run['wall_s']:.2f} s over {run['steps']} steps)",
        f"  wait per batch  p50 {run['wait_p50_ms']:.2f} ms   p90 {run['wait_p90_ms']:.2f} ms   "
        f"p99 {run['wait_p99_ms']:.2f} ms",
        *_phase_lines(run),
        f"  step            {1e3 * run['step_s']:.2f} ms mean ({run['step_timing']})",
        f"  throughput      {run['batches_per_s']:.1f} batches/s, {_rate(run['tokens_per_s'], 'tokens')}",
        f"  fetch CPU       {run['fetch_cpu_ms_per_batch']:.3f} ms per batch in the training process",
        f"  GPU             {_gpu_line(run['gpu'])}",
        f"  verdict         {run['verdict'].upper()} on the {run['verdict_basis']}; {run['verdict_rule']}",
    ]
    return lines


def _phase_lines(run: dict[str, Any]) -> list[str]:
    """The warm-up's and the steady state's data wait, apart (the verdict judges the steady state)."""
    w, st = run["warmup"], run["steady"]
    if st is None:
        return [f"  warm-up         all {w['steps']} steps (warmup_steps={run['warmup_steps']}): no steady state "
                f"to judge; measure more batches"]
    return [f"  warm-up         first {w['steps']} steps: data wait {w['data_wait_pct']:.2f}% "
            f"({w['data_wait_s']:.3f} s of {w['wall_s']:.2f} s)",
            f"  steady state    {st['steps']} steps: data wait {st['data_wait_pct']:.2f}% ({st['data_wait_s']:.3f} s "
            f"of {st['wall_s']:.2f} s), p99 {st['wait_p99_ms']:.2f} ms per batch, "
            f"{st['batches_per_s']:.1f} batches/s"]


def format_report(report: dict[str, Any]) -> str:
    """The whole report for the terminal."""
    main = report["result"]
    s = main["settings"]
    lines = [f"dataflow profile: {s['data']}  (batch {s['batch_size']} x seq_len {s['seq_len']}, "
             f"{s['batches']} batches measured after {s['warmup']} untimed start-up batches)", ""]
    lines += format_run(main)
    lines += ["", "where the loader's time goes (worker seconds during the run, all workers):"]
    lines += format_stages(main["stages"])
    if main.get("advice"):
        lines += ["", "advice:"] + [f"  - {a}" for a in main["advice"]]
    sw = report.get("sweep")
    if sw:
        lines += ["", f"sweep ({len(sw['rows'])} configurations, against {main['consumer']}):",
                  f"  {'workers':>7} {'depth':>5} {'pf':>3} {'wait %':>8} {'p99 ms':>8} {'batches/s':>9} "
                  f"{'mem MB':>8}  dominant"]
        for row in sw["rows"]:
            lines.append(f"  {row['num_workers']:>7} {row['depth']:>5} {row['prefetch_factor']:>3} "
                         f"{row['data_wait_pct']:>8.2f} {row['wait_p99_ms']:>8.2f} {row['batches_per_s']:>9.1f} "
                         f"{row['memory_estimate_mb']:>8.1f}  {row['dominant_stage'] or '-'}")
        rec = sw["recommendation"]
        lines.append("  recommended: " + " ".join(f"{k}={v}" for k, v in rec["settings"].items())
                     + f" ({rec['data_wait_pct']:.2f}% wait): {rec['why']}")
    for kind in ("trace", "plot"):
        if report.get(kind):
            lines.append(f"{kind}: {report[kind]}")
    return "\n".join(lines)
