"""Loader throughput: ours against the np.memmap ceiling and the peers, same data, same run, same machine.

One corpus (the KJV tokenized with GPT-2, replicated to --tokens), batches of 8 windows of 2049 tokens
(seq_len 2048) as int64 tensors, shuffle on, in-process and with 2 workers. Each tool runs in its own
subprocess (tools/peers/harness.py; one adapter per tool in tools/peers/*_peer.py): a crash or an
import conflict costs that tool only, and its memory is its own. A tool that fails is reported with the
reason. Each case: one untimed warm-up pass, then --repeats timed passes, each with a fresh loader;
tokens/s is the median (min-max shown), time to first batch the median, memory the peak PSS of the
tool's whole process tree (workers included).

    python tools/bench_loader.py                      # full: 200M tokens
    python tools/bench_loader.py --quick              # 20M tokens, fewer batches
    python tools/bench_loader.py --only dataflow,memmap
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import repo_data  # noqa: E402
from tools.peers.common import Ctx  # noqa: E402
from tools.peers.procs import last_error, machine, run_case, run_measured  # noqa: E402

HARNESS = os.path.join(ROOT, "tools", "peers", "harness.py")

# (peer module, setting, label); order = table order
CASES = [
    ("memmap", "get_batch", "np.memmap get_batch (ceiling)"),
    ("memmap", "dataloader", "torch DataLoader (memmap)"),
    ("dataflow", "zstd", "dataflow, zstd Arrow"),
    ("dataflow", "none", "dataflow, uncompressed Arrow"),
    ("dataflow", "tar", "dataflow, .tar.zst"),
    ("litdata", "tokens", "LitData (TokensLoader)"),
    ("webdataset", "tar", "WebDataset (tar)"),
    ("hf_datasets", "map", "HF datasets, map-style"),
    ("hf_datasets", "iterable", "HF datasets, to_iterable_dataset"),
    ("torchdata", "memmap", "torchdata StatefulDataLoader (memmap)"),
    ("mosaic", "mds", "MosaicML Streaming (MDS)"),
]
OURS = "dataflow"
CEILING = ("memmap", "get_batch")
PLAIN = ("memmap", "dataloader")  # what the "plain torch DataLoader over the nanoGPT memmap reader" means


def prepare_ours(ctx: Ctx, tokens: float) -> None:
    """GPT-2-tokenized KJV, replicated: zstd Arrow, uncompressed Arrow, tar.zst, and a flat uint16 file."""
    marker = ctx.path(".prepared")
    if os.path.exists(marker):
        return
    import numpy as np

    from dataflow import ShardWriter
    from dataflow.formats.manifest import read_manifest
    from dataflow.formats.reader import iter_documents
    from dataflow.preprocess.run import TokenizeConfig, tokenize

    base = ctx.path("kjv-gpt2")
    if not os.path.exists(os.path.join(base, "index.json")):
        tokenize(TokenizeConfig(inputs=[str(repo_data.KJV)], out=base,
                                tokenizer=str(repo_data.gpt2_json()), workers=2, progress=False))
    m = read_manifest(base)
    docs = [(i, t) for i, t in iter_documents(base, m)]
    copies = max(1, round(tokens / m.tokens))
    for p in ctx.ours.values():
        shutil.rmtree(p, ignore_errors=True)
    writers = [ShardWriter(ctx.ours[k], tokenizer_meta=m.tokenizer, format="tar" if k == "tar" else "arrow",
                           compression="none" if k == "none" else "zstd", shard_size="64MB")
               for k in ("zstd", "none", "tar")]
    with open(ctx.bin, "wb") as flat:
        for c in range(copies):
            for doc_id, toks in docs:
                for w in writers:
                    w.write(toks, id=f"{c}-{doc_id}")
                flat.write(toks.astype(np.uint16).tobytes())
    for w in writers:
        w.close()
    with open(marker, "w") as f:
        f.write(f"{copies * m.tokens}\n")


def fmt_rate(r: dict) -> str:
    return f"{r['tokens_per_s'] / 1e6:7.1f}M ({r['min'] / 1e6:.1f}-{r['max'] / 1e6:.1f})"


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tokens", type=float, default=200e6)
    p.add_argument("--work", default=None, help="data folder (default bench-out/loader-<tokens>)")
    p.add_argument("--batches", type=int, default=0, help="batches per timed pass (default: one epoch)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=30.0, help="a timed pass stops after this long")
    p.add_argument("--timeout", type=float, default=900.0, help="per tool and setting (subprocess)")
    p.add_argument("--workers", default="0,2")
    p.add_argument("--only", default=None, help="comma-separated peer modules (memmap, dataflow, litdata, ...)")
    p.add_argument("--quick", action="store_true", help="20M tokens, 10 s cap per pass")
    p.add_argument("--json", default=os.path.join(ROOT, "bench-out", "results", "loader.json"))
    args = p.parse_args()
    if args.quick:
        args.tokens, args.max_seconds, args.timeout = min(args.tokens, 20e6), 10.0, 240.0
    ctx = Ctx(args.work or os.path.join(ROOT, "bench-out", f"loader-{args.tokens / 1e6:.0f}M"))
    os.makedirs(ctx.work, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    cases = [c for c in CASES if only is None or c[0] in only]
    workers = [int(w) for w in args.workers.split(",")]
    env = dict(os.environ, PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")

    t0 = time.perf_counter()
    prepare_ours(ctx, args.tokens)
    with open(ctx.path(".prepared")) as f:
        tokens = int(f.read())
    # A pass is one epoch by default: ours decompresses a block of shards once per epoch, as any shard-based
    # reader does; a shorter pass would charge a whole block's decompression to a fraction of its batches.
    args.batches = args.batches or (tokens - 1) // 2048 // 8
    print(f"corpus: {tokens / 1e6:.0f}M GPT-2 tokens (KJV replicated), batches of 8 x 2049 int64, "
          f"{args.repeats} timed passes of {args.batches} batches (one epoch) or {args.max_seconds:.0f} s per case; "
          f"prepared in {time.perf_counter() - t0:.0f} s", flush=True)

    failed: dict[str, str] = {}
    for peer in dict.fromkeys(c[0] for c in cases):
        t1 = time.perf_counter()
        r = run_measured([sys.executable, HARNESS, "loader-prepare", peer, "--work", ctx.work], args.timeout * 2, env)
        if r["rc"] != 0:
            failed[peer] = "prepare: " + ("timed out" if r["rc"] == "timeout" else last_error(r["log"]))
            print(f"  {peer}: preparation FAILED: {failed[peer]}", flush=True)
        elif time.perf_counter() - t1 > 1:
            print(f"  {peer}: prepared its format in {time.perf_counter() - t1:.0f} s", flush=True)

    results = []
    print(f"\n{'tool, setting':<40} {'workers':>7} {'tokens/s (min-max)':>22} {'first batch':>11} {'main CPU':>9} "
          f"{'peak MB':>8} {'disk MB':>8}", flush=True)
    for w in workers:
        for peer, setting, label in cases:
            if (peer, setting) == CEILING and w:
                continue  # get_batch runs in the training process
            row = {"peer": peer, "setting": setting, "label": label, "workers": w}
            if peer in failed:
                row["error"] = failed[peer]
            else:
                out = os.path.join(ctx.work, f"result-{peer}-{setting}-{w}.json")
                cmd = [sys.executable, HARNESS, "loader-run", peer, setting, "--work", ctx.work, "--workers", str(w),
                       "--batches", str(args.batches), "--repeats", str(args.repeats),
                       "--max-seconds", str(args.max_seconds), "--out", out]
                row.update(run_case(cmd, out, args.timeout, env))
            results.append(row)
            if "error" in row:
                print(f"{label:<40} {w:>7} FAILED: {row['error']}", flush=True)
            else:
                print(f"{label:<40} {w:>7} {fmt_rate(row):>22} {row['first_batch_s']:>10.3f}s "
                      f"{row['main_cpu_ms']:>6.3f} ms {row['peak_mb']:>8.0f} {row['disk_bytes'] / 1e6:>8.0f}", flush=True)

    ratios = compute_ratios(results)
    print("\nratios (same run)")
    for line in ratios["lines"]:
        print("  " + line)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"tokens": tokens, "batches": args.batches, "repeats": args.repeats, "max_seconds": args.max_seconds,
                   "quick": args.quick, "machine": machine(), "results": results, "ratios": ratios,
                   "command": "python tools/bench_loader.py" + (" --quick" if args.quick else "")}, f, indent=1)
    print(f"\nresults: {os.path.relpath(args.json, ROOT)}")
    return 0


def compute_ratios(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    get = lambda peer, setting, w: next((r for r in ok if (r["peer"], r["setting"], r["workers"]) == (peer, setting, w)), None)  # noqa: E731
    ceiling = get(*CEILING, 0)
    out: dict = {"lines": []}
    for setting, name, target in (("zstd", "zstd Arrow", 0.5), ("none", "uncompressed Arrow", 0.8), ("tar", ".tar.zst", None)):
        r = get(OURS, setting, 0)
        if r and ceiling:
            x = r["tokens_per_s"] / ceiling["tokens_per_s"]
            out[f"ceiling_{setting}"] = x
            goal = f" (target >= {target:.0%}: {'met' if x >= target else 'NOT met'})" if target else ""
            out["lines"].append(f"ours in-process, {name}: {x:.0%} of the memmap ceiling{goal}")
    for w in sorted({r["workers"] for r in ok}):
        peers = [r for r in ok if r["peer"] != OURS and (r["peer"], r["setting"]) != CEILING and r["workers"] == w]
        if not peers:
            continue
        best = max(peers, key=lambda r: r["tokens_per_s"])
        for setting in ("zstd", "none"):
            r = get(OURS, setting, w)
            if r:
                x = r["tokens_per_s"] / best["tokens_per_s"]
                out[f"peer_{setting}_{w}"] = x
                out[f"best_peer_{w}"] = best["label"]
                goal = f" (target >= 3x: {'met' if x >= 3 else 'NOT met'})" if w == 2 else ""
                out["lines"].append(f"ours {w} workers, {'zstd' if setting == 'zstd' else 'uncompressed'} Arrow: "
                                    f"{x:.2f}x the fastest peer with {w} workers ({best['label']}){goal}")
    plain = get(*PLAIN, 2)
    for setting, name in (("zstd", "zstd"), ("none", "uncompressed")):
        r = get(OURS, setting, 2)
        if not r:
            continue
        if ceiling:
            x = r["tokens_per_s"] / ceiling["tokens_per_s"]
            out[f"ceiling_{setting}_2"] = x
            out["lines"].append(f"ours 2 workers, {name} Arrow: {x:.0%} of the in-process memmap ceiling "
                                f"(target >= 50%: {'met' if x >= 0.5 else 'NOT met'})")
        if plain:
            x = r["tokens_per_s"] / plain["tokens_per_s"]
            cpu = r["main_cpu_ms"] / plain["main_cpu_ms"]
            out[f"plain_{setting}_2"], out[f"main_cpu_{setting}_2"] = x, cpu
            out["lines"].append(f"ours 2 workers, {name} Arrow: {x:.2f}x the plain torch DataLoader with 2 workers "
                                f"(target >= 3x: {'met' if x >= 3 else 'NOT met'}); main-process CPU per batch "
                                f"{r['main_cpu_ms']:.3f} ms = {cpu:.2f} of its {plain['main_cpu_ms']:.3f} ms "
                                f"(target <= 0.20: {'met' if cpu <= 0.2 else 'NOT met'})")
    firsts = [(r["label"], r["workers"], r["first_batch_s"]) for r in ok if r["peer"] == OURS]
    if firsts:
        worst = max(firsts, key=lambda f: f[2])
        out["first_batch_max"] = worst[2]
        out["lines"].append(f"ours, slowest time to first batch: {worst[2]:.3f} s ({worst[0]}, {worst[1]} workers; "
                            f"target < 1 s: {'met' if worst[2] < 1 else 'NOT met'})")
    return out


if __name__ == "__main__":
    sys.exit(main())
