"""Writes docs/benchmarks.md (tables) and docs/benchmarks.png (tokens/s by tool and setting) from the JSON results of
tools/bench_loader.py and tools/bench_tokenize.py.

    python tools/peers/report.py [--loader bench-out/results/loader.json] [--tokenize bench-out/results/tokenize.json]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

NOTES_LOADER = """\
- Every tool reads the same tokens (the GPT-2-tokenized KJV, replicated), written once in its own format by its own
  writer; the flat `tokens.bin` (uint16) is what `np.memmap` and torchdata read. Each yields batches of 8 windows of
  2049 tokens as int64 (ours: `input_ids` and `labels`, 8 x 2048 each, from the same 2049-token windows).
- Shuffle on for every tool: random windows (memmap), shard-block shuffle (ours, default `shuffle_window=8`),
  LitData's and Mosaic's own shuffles, `shardshuffle` + `shuffle(1000)` (WebDataset), a random sampler (HF map-style,
  torchdata), `shuffle(buffer_size=1000)` (HF iterable).
- Each tool and setting runs in its own subprocess: one untimed warm-up pass (page cache, imports), then 3 timed
  passes, each with a fresh loader and one epoch long (or cut at the time cap for slow tools): a shard-based reader
  decompresses each block of shards once per epoch, so a pass shorter than an epoch would overcharge it; tokens/s = 8 x 2049 tokens per batch after the first one, median of the 3
  (min-max in brackets); time to first batch is from the loader's construction (workers started) to the first batch.
- Peak memory is the peak PSS of the tool's process tree (main process and workers, sampled every 0.25 s): PSS
  splits shared pages (shared memory, mapped files) between the processes that map them, so a sum over workers
  counts each page once. Mapped shard files count when touched: the memmap readers' figure grows with the file.
- `np.memmap get_batch` runs in the training process only, so it has no 2-worker row; it is the ceiling for reading
  (no decoding, no shuffling state, no workers). `torch DataLoader (memmap)` is the plain torch `DataLoader` over the
  same windows (map-style, shuffled): what a training script with workers typically does.
- Main-process CPU per batch is the CPU time of the training process (all its threads) between the first and the
  last batch, divided by the batches: what loading takes from the training loop. With workers it is the hand-off
  alone; in the training process it is all the loading.
- Ours yields, with workers, views of a shared slot ring that stay valid while referenced (a slot goes back to
  the workers when the batch is dropped); the peers yield owned tensors.
"""

NOTES_INSTALL = """\
## Environment of the peers

`.bench-venv` is created with the same python as `.venv`; torch 2.13.0 (CPU) is installed first and pinned in
`tools/requirements-peers.txt` (without the pin, torchvision, which LitData requires, upgrades torch to a
multi-GB CUDA build), then the project (`pip install -e .`), then the peers: LitData 0.2.76, WebDataset 1.0.2, HF
datasets, torchdata 0.11.0, datatrove 0.10.1 (+ orjson). The torchvision that pip resolves for LitData does not load
beside the CPU torch (`operator torchvision::nms does not exist`); LitData never imports it on these paths.

MosaicML Streaming 0.13.0 pins `numpy<2.2` (the project and datatrove run numpy 2.4 here) and requires
transformers<5 (which would pin tokenizers<0.22 and huggingface-hub<1, conflicting with the project and datatrove),
cloud SDKs and torchvision. It is installed with `--no-deps` plus the packages it imports
(`tools/peers/requirements-nodeps.txt`: Brotli, python-snappy, zstd, xxhash, catalogue), and runs on numpy 2.4,
outside its declared range. Its package imports `torchvision` (for `streaming.vision`) and `transformers` (for
`streaming.text` and two isinstance checks in its DataLoader subclass) at import time; both are stubbed in
`sys.modules` in its benchmark process only, and none of that code runs here (the benchmark uses torch's
DataLoader). Its setting: a larger `predownload` (512 samples per worker instead of 8 x batch size = 64).
"""

NOTES_TOKENIZE = """\
- One JSONL file per copy of the KJV, the GPT-2 `tokenizer.json` for every tool; EOS appended after each document.
- One engine thread per worker process for every tool (`RAYON_NUM_THREADS=1`, `TOKENIZERS_PARALLELISM=false`):
  every tool's parallelism is its worker processes.
- Time is taken inside each tool's process around its own call (imports excluded; reading, parsing, tokenizing
  and writing included). The raw engines tokenize texts already parsed, in warm forked processes, and write
  nothing: they are the ceiling of any pipeline built on them.
- `dataflow tokenize` runs through the function the CLI calls (`dataflow.preprocess.run.tokenize`), with the CLI's
  defaults: `--engine auto` runs the fastest engine proven to give `tokenizers`' ids (gigatoken for GPT-2, then
  tiktoken). The peers run `tokenizers` (what they do with a `tokenizer.json`); `--engine hf` is ours on the same
  engine. Its time includes loading and proving the tokenizer and checking it on the input (the raw engines'
  does not).
- `dataflow tokenize ONE.jsonl.zst` is the same corpus as one zstd-compressed file, which the command decompresses
  once and splits across its workers; its time is the summary's, and "whole command" is the wall time of the
  `dataflow tokenize` process (interpreter start, imports and exit included).
- "cores used" is the CPU time (user + system) of the tool's process and of its worker processes during its call,
  divided by its wall time: a tool whose main process works beside its workers uses more than `workers` cores.
- Token ids: every tool's output is read back and its documents compared, as a multiset of token-id sequences
  (EOS removed), with `tokenizers`' `encode_batch` on the same texts; "identical" means every document of the
  corpus, not a sample.
"""


def _fmt_rate(r: dict, key: str = "tokens_per_s") -> str:
    return f"{r[key] / 1e6:.1f}M ({r['min'] / 1e6:.1f}–{r['max'] / 1e6:.1f})"


def loader_tables(d: dict) -> list[str]:
    res = d["results"]
    ceiling = next((r for r in res if (r["peer"], r["setting"]) == ("memmap", "get_batch") and "error" not in r), None)
    lines = [f"Corpus: {d['tokens'] / 1e6:.0f}M GPT-2 tokens; batches of 8 x 2049 int64; {d['repeats']} timed passes of "
             f"{d['batches']} batches (one epoch) or {d['max_seconds']:.0f} s, whichever comes first, per tool and setting. "
             f"Command: `{d['command']}`.", ""]
    for w in sorted({r["workers"] for r in res}):
        lines += [f"### {'In the training process (num_workers=0)' if w == 0 else f'{w} workers'}", "",
                  "| tool | tokens/s, median (min–max) | vs ceiling | first batch | main-process CPU per batch | "
                  "peak memory (PSS) | on disk |",
                  "|---|---:|---:|---:|---:|---:|---:|"]
        for r in [r for r in res if r["workers"] == w]:
            if "error" in r:
                lines.append(f"| {r['label']} | **failed**: {r['error'].replace('|', '/')} | | | | | |")
                continue
            vs = f"{r['tokens_per_s'] / ceiling['tokens_per_s']:.0%}" if ceiling else "–"
            cpu = f"{r['main_cpu_ms']:.3f} ms" if "main_cpu_ms" in r else "–"
            lines.append(f"| {r['label']} | {_fmt_rate(r)} | {vs} | {r['first_batch_s'] * 1e3:.0f} ms | {cpu} | "
                         f"{r['peak_mb']:.0f} MB | {r['disk_bytes'] / 1e6:.0f} MB |")
        lines.append("")
    lines += ["Settings:", ""]
    seen = set()
    for r in res:
        if r["label"] in seen:
            continue
        seen.add(r["label"])
        lines.append(f"- **{r['label']}**: {r.get('describe') or r.get('error', '')}"
                     .replace("num_workers=0", "num_workers=N").replace("num_workers=2", "num_workers=N"))
    return lines + [""]


def tokenize_tables(d: dict) -> list[str]:
    res = d["results"]
    lines = [f"Corpus: {d['jsonl_bytes'] / 1e6:.0f} MB of JSONL ({d['text_bytes'] / 1e6:.0f} MB of text). "
             f"Command: `{d['command']}`.", "",
             "| tool | workers | MB of text/s | tokens/s | cores used | peak memory (PSS) | token ids vs `tokenizers` |",
             "|---|---:|---:|---:|---:|---:|---|"]
    for r in res:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['workers']} | **failed**: {r['error'].replace('|', '/')} | | | | |")
        else:
            whole = r["peer"].startswith("dataflow-zst")  # the CLI run as a command: its memory is not taken
            cores = f"{r['cpu_s'] / r['seconds']:.2f}" if "cpu_s" in r else \
                f"{r['command_cpu_s'] / r['command_seconds']:.2f} (whole command)" if r.get("command_cpu_s") else \
                "-" if whole else f"{r['workers']} (by design)"
            peak = "-" if whole else f"{r['peak_mb']:.0f} MB"
            rate = f"{r['mb_per_s']:.2f}" + (f" ({r['mb_per_s'] * r['seconds'] / r['command_seconds']:.2f} whole "
                                             f"command)" if whole and r.get("command_seconds") else "")
            lines.append(f"| {r['label']} | {r['workers']} | {rate} | {r['tokens_per_s'] / 1e6:.2f}M | "
                         f"{cores} | {peak} | {r.get('ids', '')} |")
    lines += ["", "Settings:", ""]
    seen = set()
    for r in res:
        if r["label"] not in seen and r.get("describe"):
            seen.add(r["label"])
            lines.append(f"- **{r['label']}**: {r['describe']}".replace("--workers 1", "--workers N")
                         .replace("workers=1", "workers=N").replace("1 forked", "N forked").replace("1/1 of", "1/N of"))
    return lines + [""]


def chart(loader: dict | None, tok: dict | None, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [p for p in (loader, tok) if p]
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 6.5), squeeze=False)
    colors = {0: "#4c72b0", 1: "#4c72b0", 2: "#dd8452"}
    for ax, d in zip(axes[0], panels):
        is_loader = d is loader
        rows = [r for r in d["results"]]
        labels = list(dict.fromkeys(r["label"] for r in rows))
        ws = sorted({r["workers"] for r in rows})
        h = 0.8 / len(ws)
        for j, w in enumerate(ws):
            for i, label in enumerate(labels):
                r = next((r for r in rows if r["label"] == label and r["workers"] == w), None)
                y = i + (j - (len(ws) - 1) / 2) * h
                if r is None:
                    continue
                if "error" in r:
                    ax.text(0, y, "  failed", va="center", fontsize=7, color="#c44e52")
                    continue
                v = r["tokens_per_s"] / 1e6
                bold = r["peer"] == "dataflow"
                kw = {}
                if is_loader:
                    kw["xerr"] = [[v - r["min"] / 1e6], [r["max"] / 1e6 - v]]
                ax.barh(y, v, height=h, color=colors.get(w, "#55a868"), edgecolor="black" if bold else "none",
                        linewidth=1.2, label=(f"{w} workers" if is_loader else f"{w} worker{'s' * (w > 1)}")
                        if i == 0 or not any(x["workers"] == w for x in rows[:0]) else None, **kw)
                ax.text(max(v, r["max"] / 1e6) if is_loader else v, y, f" {v:.1f}" if v < 10 else f" {v:.0f}",
                        va="center", fontsize=7)
        ax.set_yticks(range(len(labels)))
        ax.set_yticklabels(labels, fontsize=8)
        ax.invert_yaxis()
        ax.set_xlabel("million tokens/s" + (" (median of 3; bars: min–max)" if is_loader else ""))
        ax.set_title("Loader: 8 x 2049 int64 batches, shuffled" if is_loader else "Tokenize: GPT-2 tokenizer.json, JSONL")
        handles, names = ax.get_legend_handles_labels()
        uniq = dict(zip(names, handles))
        ax.legend(uniq.values(), uniq.keys(), fontsize=8, loc="lower right")
        ax.grid(axis="x", alpha=0.3)
    m = (loader or tok)["machine"]
    fig.suptitle(f"dataflow vs peers — {m['cpu']}, {m['cores']} cores, {m['ram_gib']:.0f} GiB "
                 f"({'quick' if (loader or tok).get('quick') else 'full'} run)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def headline(loader: dict | None, tok: dict | None) -> list[str]:
    out = []
    if loader:
        r = loader["ratios"]
        parts = []
        if "ceiling_zstd" in r:
            parts.append(f"**{r['ceiling_zstd']:.0%} of the `np.memmap` ceiling** in the training process from zstd "
                         f"shards ({r.get('ceiling_none', 0):.0%} from uncompressed)")
        if "peer_zstd_2" in r:
            parts.append(f"**{r['peer_zstd_2']:.1f}x the fastest peer with 2 workers** ({r['best_peer_2']}) from zstd "
                         f"shards")
        if parts:
            out.append("- Loader: " + "; ".join(parts) + ".")
    if tok:
        r = tok["ratios"]
        best = max((k for k in r if k.startswith("peer_") and isinstance(r[k], float)), default=None)
        if "peer_2" in r:
            out.append(f"- Tokenize: **{r['peer_2']:.1f}x the fastest peer with 2 workers** ({r['best_peer_2']}), "
                       f"with identical token ids; {r.get('raw_2', 0):.0%} of the raw engine it runs.")
        elif best:
            out.append(f"- Tokenize: {r[best]:.1f}x the fastest peer.")
    return out


def coordinator_section(d: dict) -> list[str]:
    """tools/bench_tokenize_coordinator.py's figures: what the process the user started costs per GB, and the
    per-node throughput that implies."""
    lines = ["## Tokenize: scaling with cores", "",
             f"`tools/bench_tokenize_coordinator.py`: `dataflow tokenize --workers {d['workers']}` on "
             f"{d['sizes_mb'][0]:.0f} and {d['sizes_mb'][1]:.0f} MB of JSONL (distinct words), CPU time of the "
             f"command's own process (`RUSAGE_SELF`) against its workers' (`RUSAGE_CHILDREN`), marginal between the "
             f"two sizes so that the fixed start cancels"
             + (f" (each figure the median of {len(d['coordinator_share_rounds'])} interleaved rounds)"
                if "coordinator_share_rounds" in d else "") + ":", ""]
    ceiling = d["ceiling_mb_s"]
    per_gb, share = max(d["coordinator_cpu_s_per_gb"], 0.0), max(d["coordinator_share"], 0.0)  # noise below 0
    first = (f"- the coordinator: {per_gb:.2f} CPU-s per GB of text, {share:.1%} of the run's marginal CPU"
             if d["coordinator_cpu_s_per_gb"] > 0 else
             "- the coordinator: no marginal CPU measurable (the large runs' coordinator spent less than the small "
             "runs', by the noise of its fixed start)")
    lines += [f"{first} (target: at most 3%: {'met' if share <= 0.03 else 'NOT met'})",
              *(["- its share in each interleaved round (small run, then large): "
                 + ", ".join(f"{x:+.1%}" for x in d["coordinator_share_rounds"])
                 + " (below 0: the large run's coordinator spent less; the noise of a fixed start of ~1.5 CPU-s)"]
                if "coordinator_share_rounds" in d else []),
              *([f"- the coordinator from its first commit to its last (the work that grows with the input): "
                 f"{d['committing_cpu_s_per_gb']:.2f} CPU-s per GB of text"] if "committing_cpu_s_per_gb" in d else []),
              "- the per-node ceiling it sets: " + ("none measurable (its marginal CPU is within the noise)"
                                                    if ceiling == float("inf") else f"{ceiling:,.0f} MB/s of text"),
              f"- the workers: {d['worker_mb_s_per_core']:.1f} MB/s of text per busy core"]
    for cores, mb_s in sorted(d["projection_mb_s"].items(), key=lambda kv: int(kv[0])):
        lines.append(f"- projected at {cores} cores: {mb_s:,.0f} MB/s of text")
    lines.append(f"- one `.jsonl.zst` file is decompressed by one process: its serial ceiling is "
                 f"{d['zst_decompression_mb_s']:,.0f} MB/s of text here")
    if "zst_files_coordinator_share" in d:  # (results of an older benchmark lack it)
        lines.append(f"- the same corpus as {d['zst_files']} `.jsonl.zst` files (each worker decompresses its own): "
                     f"the coordinator's share {max(d['zst_files_coordinator_share'], 0.0):.1%} of the marginal CPU")
    return lines + [""]


FAMILIES_HEADING = "## Tokenize: every tokenizer family"
REMOTE_HEADING = "## Streaming from object storage"


def sections(md: str) -> dict[str, str]:
    """A page's `## ` sections by heading line, each with its text up to the next `## ` heading."""
    out, heading, body = {}, None, []
    for line in md.splitlines():
        if line.startswith("## "):
            if heading:
                out[heading] = "\n".join(body).rstrip() + "\n"
            heading, body = line, [line]
        elif heading:
            body.append(line)
    if heading:
        out[heading] = "\n".join(body).rstrip() + "\n"
    return out


def extra_sections(families: str, remote: str, old: dict[str, str]) -> list[str]:
    """The sections other benchmarks feed: tokenizer families (tools/bench_tokenize.py families' JSON) and object
    storage (tools/bench_remote.py's --markdown file). Where a run left no results, the page's current section
    stays as it is: a `make bench` that ran neither does not erase their tables."""
    out = []
    if os.path.exists(families):
        from tools import bench_tokenize_families

        with open(families) as f:
            out += [FAMILIES_HEADING, ""] + bench_tokenize_families.markdown(json.load(f))
    elif FAMILIES_HEADING in old:
        out += [old[FAMILIES_HEADING]]
    if os.path.exists(remote):
        with open(remote) as f:
            out += [REMOTE_HEADING, "", f.read().rstrip(), ""]
    elif REMOTE_HEADING in old:
        out += [old[REMOTE_HEADING]]
    return out


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--loader", default=os.path.join(ROOT, "bench-out", "results", "loader.json"))
    p.add_argument("--tokenize", default=os.path.join(ROOT, "bench-out", "results", "tokenize.json"))
    p.add_argument("--coordinator", default=os.path.join(ROOT, "bench-out", "results", "tokenize_coordinator.json"))
    p.add_argument("--md", default=os.path.join(ROOT, "docs", "benchmarks.md"))
    p.add_argument("--png", default=os.path.join(ROOT, "docs", "benchmarks.png"))
    p.add_argument("--analysis", default=os.path.join(ROOT, "tools", "peers", "analysis.md"),
                   help="hand-written findings appended to the report (profiles, where time goes)")
    p.add_argument("--families", default=os.path.join(ROOT, "bench-out", "results", "tokenize-families.json"))
    p.add_argument("--remote", default=os.path.join(ROOT, "bench-out", "results", "remote.md"),
                   help="tools/bench_remote.py --markdown's file")
    a = p.parse_args()
    load = lambda f: json.load(open(f)) if os.path.exists(f) else None  # noqa: E731
    loader, tok, coordinator = load(a.loader), load(a.tokenize), load(a.coordinator)
    old_md = open(a.md).read() if os.path.exists(a.md) else ""
    old = sections(old_md)
    extra = extra_sections(a.families, a.remote, old)
    if not loader and not tok:
        if not (os.path.exists(a.families) or os.path.exists(a.remote)):
            print("no results to report", file=sys.stderr)
            return 1
        return _update_in_place(a.md, old_md, old, extra)
    m = (loader or tok)["machine"]
    quick = (loader or tok).get("quick")
    md = ["# Benchmarks", "",
          f"Measured {datetime.date.today().isoformat()} on {m['cpu']}, {m['cores']} cores, {m['ram_gib']:.0f} GiB RAM "
          f"(Python {m['python']}, no GPU), a machine shared with other jobs, so absolute numbers are noisy; every "
          f"ratio below compares figures from the same run.", ""]
    md += headline(loader, tok)
    size = (f"{loader['tokens'] / 1e6:.0f}M tokens" if loader else "") + (", " if loader and tok else "") + \
        (f"{tok['jsonl_bytes'] / 1e6:.0f} MB of JSONL" if tok else "")
    md += ["", f"This page is the output of `make {'bench-quick' if quick else 'bench'}` ({size}). "
               f"Reproduce with `make bench-quick` (under 10 minutes on 2 cores after setup) or `make bench` (the full "
               f"run); both set up `.bench-venv` (torch 2.13.0 CPU, the project, the peers), run "
               f"`tools/bench_tokenize.py`, `tools/bench_tokenize_coordinator.py` and `tools/bench_loader.py`, and "
               f"rewrite this page and "
               f"`docs/benchmarks.png`.", "", "![tokens/s by tool and setting](benchmarks.png)", ""]
    if loader:
        md += ["## Targets", ""] + [f"- {x}" for x in loader["ratios"]["lines"]]
    if tok:
        md += [f"- {x}" for x in tok["ratios"]["lines"]]
    md.append("")
    if loader:
        md += ["## Loader", ""] + loader_tables(loader) + ["How it is measured:", "", NOTES_LOADER]
    if tok:
        md += ["## Tokenize", ""] + tokenize_tables(tok) + ["How it is measured:", "", NOTES_TOKENIZE]
    if coordinator:
        md += coordinator_section(coordinator)
    fails = [f"{r['label']} ({r['workers']} workers): {r['error']}" for d in (loader, tok) if d for r in d["results"]
             if "error" in r]
    md += [NOTES_INSTALL, ("Failed in this run: " + "; ".join(fails) + "." if fails else
                           "No tool failed to install or run in this run; one that does is listed in its table with "
                           "the reason.") + "\n"]
    md += extra
    if os.path.exists(a.analysis):
        with open(a.analysis) as f:
            md += [f.read()]
    _write(a.md, "\n".join(md).rstrip() + "\n")
    chart(loader, tok, a.png)
    print(f"wrote {os.path.relpath(a.md, ROOT)} and {os.path.relpath(a.png, ROOT)}")
    return 0


def _update_in_place(path: str, old_md: str, old: dict[str, str], extra: list[str]) -> int:
    """Only the families and object-storage sections are new: replace (or add, before the profiles) those two in
    the current page and keep the rest of it as it is."""
    new = sections("\n".join(extra))
    text = old_md
    for heading, body in new.items():
        if heading in old:
            text = text.replace(old[heading], body)
        elif "## Where our time goes" in text:
            text = text.replace("## Where our time goes", body + "\n## Where our time goes", 1)
        else:
            text = text.rstrip() + "\n\n" + body
    _write(path, text)
    print(f"updated {', '.join(h[3:] for h in new)} in {os.path.relpath(path, ROOT)}")
    return 0


def _write(path: str, text: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
