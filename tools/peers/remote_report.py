"""The tables `tools/bench_remote.py` prints: one row per loader and worker count, then each measure's ratio to
the best loader of that worker count (1.00 = the best; for the ceiling share the best is the largest)."""

from __future__ import annotations

HEADER = (f"{'code':10} {'workers':>7} {'open s':>7} {'first s':>8} {'resumed s':>9} {'ceiling':>8} {'fetched':>8} "
          f"{'after resume':>12} {'GETs':>5} {'peak MB':>8} {'cache MB':>8}  samples  resume")

# (key, title, best is the smallest?)
MEASURES = (("first_s", "first batch", True), ("first_resumed_s", "after resume", True),
            ("share", "ceiling", False), ("fetched_resumed_x", "fetched after resume", True),
            ("peak_rss", "peak memory", True), ("cache_peak", "cache peak", True))


def _num(v: float | None, fmt: str, width: int) -> str:
    return f"{'n/a' if v is None else format(v, fmt):>{width}}"


def derive(r: dict, data_bytes: int, ceiling_tps: float) -> dict:
    """The per-case measures the tables print: the ceiling share, fetched in multiples of the loader's own
    dataset bytes (its format's size on the bucket)."""
    if "error" in r:
        return r
    r = dict(r)
    r["share"] = r["tokens"] / r["epoch_s"] / ceiling_tps
    r["fetched_x"] = r["fetched"] / data_bytes
    r["fetched_resumed_x"] = r["fetched_resumed"] / data_bytes if r["first_resumed_s"] is not None else None
    return r


def row(code: str, workers: int, r: dict) -> str:
    if "error" in r:
        return f"{code:10} {workers:>7}  failed: {r['error']}"
    return (f"{code:10} {workers:>7} {r['open_s']:>7.2f} {r['first_s']:>8.2f} {_num(r['first_resumed_s'], '.2f', 9)} "
            f"{r['share']:>8.2f} {r['fetched_x']:>7.2f}x {_num(r['fetched_resumed_x'], '.2f', 11)}"
            f"{'' if r['fetched_resumed_x'] is None else 'x'} {r['gets']:>5} {r['peak_rss'] / 1e6:>8.0f} "
            f"{r['cache_peak'] / 1e6:>8.0f}  {r['samples']:7}  {r['resume']}")


def ratios(workers: int, results: dict[str, dict]) -> list[str]:
    """Each measure over the best loader's (those that measured it; a cache peak of 0, a loader that caches
    nothing, is left out of that measure's best)."""
    ok = {c: r for c, r in results.items() if "error" not in r}
    if len(ok) < 2:
        return []
    lines = [f"{f'  ratio to the best, {workers} workers:':35}" + "  ".join(f"{title:>12}" for _, title, _ in MEASURES)]
    best = {}
    for key, _, low in MEASURES:
        vals = [r[key] for r in ok.values() if r.get(key) is not None and not (key == "cache_peak" and r[key] == 0)]
        best[key] = (min(vals) if low else max(vals)) if vals else None
    for code, r in ok.items():
        cells = []
        for key, _, _ in MEASURES:
            v, b = r.get(key), best[key]
            if v is None or not b or (key == "cache_peak" and v == 0):
                cells.append(f"{'n/a':>12}")
            else:
                cells.append(f"{v / b:>12.2f}")
        lines.append(f"  {code:33}" + "  ".join(cells))
    return lines


def markdown(results: list[dict]) -> str:
    """Every case as one markdown table (docs/benchmarks*.md), ratios to the best of its condition and worker
    count in brackets."""
    out = ["| link | loader | workers | first batch s | after resume s | ceiling share | fetched | fetched after "
           "resume | GETs | peak MB | cache MB | samples | resume |", "|" + "---|" * 13]
    groups: dict[tuple, dict[str, dict]] = {}
    for r in results:
        groups.setdefault((r["latency_ms"], r["mbps"], r["workers"]), {})[r["code"]] = r
    for (latency, mbps, workers), by_code in groups.items():
        best = {}
        for key, _, low in MEASURES:
            vals = [r[key] for r in by_code.values() if "error" not in r and r.get(key) is not None
                    and not (key == "cache_peak" and r[key] == 0)]
            best[key] = (min(vals) if low else max(vals)) if vals else None

        def cell(r: dict, key: str, fmt: str, scale: float = 1.0, unit: str = "") -> str:
            v, b = r.get(key), best.get(key)
            if v is None:
                return "n/a"
            ratio = f" ({v / b:.2f})" if b and not (key == "cache_peak" and v == 0) else ""
            return f"{format(v / scale, fmt)}{unit}{ratio}"

        for code, r in by_code.items():
            cells = [f"{latency:.0f} ms / {mbps:.0f} MB/s", code, str(workers)]
            if "error" in r:
                cells += [f"failed: {r['error']}"] + [""] * 9
            else:
                cells += [cell(r, "first_s", ".2f"), cell(r, "first_resumed_s", ".2f"), cell(r, "share", ".2f"),
                          f"{r['fetched_x']:.2f}x", cell(r, "fetched_resumed_x", ".2f", unit="x"), str(r["gets"]),
                          cell(r, "peak_rss", ".0f", 1e6), cell(r, "cache_peak", ".0f", 1e6), r["samples"],
                          r["resume"]]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)
