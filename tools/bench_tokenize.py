"""Tokenize throughput: ours against the raw engines and the peers, same corpus, same run, same machine.

The corpus is the KJV replicated to --mb megabytes of JSONL (one file per copy, ids made unique), tokenized
with the GPT-2 `tokenizer.json`, with 1 and 2 workers. Each tool runs in its own subprocess
(tools/peers/harness.py) with one engine thread per worker process (RAYON_NUM_THREADS=1,
TOKENIZERS_PARALLELISM=false); its time is taken inside that process around the tool's own call (imports
excluded, reading, tokenizing and writing included); its memory is the peak PSS of its process tree. Every
tool's output is read back and its documents compared, as a multiset of token-id sequences, with
`tokenizers`' ids for the same texts.

    python tools/bench_tokenize.py            # full: 100 MB
    python tools/bench_tokenize.py --quick    # 30 MB
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import repo_data  # noqa: E402
from tools.peers.procs import machine, run_case  # noqa: E402

HARNESS = os.path.join(ROOT, "tools", "peers", "harness.py")

# (peer module, setting, label); the first row is the reference for the token-id check
CASES = [
    ("raw_tokenizers", "tokenizers", "raw tokenizers encode_batch"),
    ("raw_tokenizers", "tiktoken", "raw tiktoken encode_ordinary_batch"),
    ("dataflow", "auto", "dataflow tokenize"),
    ("dataflow", "hf", "dataflow tokenize --engine hf"),
    ("litdata", "optimize", "LitData optimize()"),
    ("datatrove", "tokenizer", "datatrove DocumentTokenizer"),
]
RAW = "raw_tokenizers"
OURS = ("dataflow", "auto")


def write_corpus(work: str, mb: float) -> tuple[int, int]:
    """One JSONL file per copy of the KJV; returns (JSONL bytes, UTF-8 bytes of the texts)."""
    import zstandard

    d = os.path.join(work, "input")
    with open(repo_data.KJV, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)
    copies = max(1, round(mb * 1e6 / sum(len(x) for x in lines)))
    text = sum(len(json.loads(x)["text"].encode()) for x in lines) * copies
    if os.path.isdir(d) and len(os.listdir(d)) == copies:
        return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)), text
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    for c in range(copies):
        with open(os.path.join(d, f"part-{c:04d}.jsonl"), "wb") as f:
            for line in lines:
                f.write(line.replace(b'"id": "', f'"id": "{c}-'.encode(), 1))
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)), text


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=100)
    p.add_argument("--work", default=None, help="default bench-out/tokenize-<MB>M")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--only", default=None, help="comma-separated peer modules")
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--quick", action="store_true", help="30 MB")
    p.add_argument("--json", default=os.path.join(ROOT, "bench-out", "results", "tokenize.json"))
    args = p.parse_args()
    if args.quick:
        args.mb, args.timeout = min(args.mb, 30), 300.0
    work = args.work or os.path.join(ROOT, "bench-out", f"tokenize-{args.mb:.0f}M")
    os.makedirs(work, exist_ok=True)
    jsonl, text = write_corpus(work, args.mb)
    print(f"corpus: {jsonl / 1e6:.0f} MB of JSONL ({text / 1e6:.0f} MB of text; KJV replicated), GPT-2 tokenizer.json, "
          f"{os.cpu_count()} CPUs, one engine thread per process", flush=True)
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore",
               BENCH_GPT2_JSON=str(repo_data.gpt2_json()))
    only = set(args.only.split(",")) if args.only else None
    cases = [c for c in CASES if only is None or c[0] in only]
    results = []
    ref_hashes: dict[int, collections.Counter] = {}
    print(f"\n{'tool':<36} {'workers':>7} {'MB text/s':>10} {'Mtok/s':>8} {'cores':>6} {'peak MB':>8} "
          f"{'ids vs tokenizers':>18}",
          flush=True)
    for w in [int(x) for x in args.workers.split(",")]:
        for peer, setting, label in cases:
            out = os.path.join(work, f"result-{peer}-{setting}-{w}.json")
            cmd = [sys.executable, HARNESS, "tokenize-run", peer, setting, "--work", work, "--workers", str(w), "--out", out]
            row = {"peer": peer, "setting": setting, "label": label, "workers": w}
            row.update(run_case(cmd, out, args.timeout, env))
            if "error" not in row:
                row["mb_per_s"] = text / 1e6 / row["seconds"]
                row["tokens_per_s"] = row["tokens"] / row["seconds"]
                with open(out + ".hashes.json") as f:
                    hashes = collections.Counter(json.load(f))
                if peer == RAW and setting == "tokenizers":
                    ref_hashes[w] = hashes
                ref = ref_hashes.get(w) or next(iter(ref_hashes.values()), None)
                if ref is None:
                    row["ids"] = "no reference"
                else:
                    diff = sum((hashes - ref).values()) + sum((ref - hashes).values())
                    row["ids_identical"] = diff == 0
                    row["ids"] = (f"identical ({row['docs']:,} docs)" if diff == 0 else
                                  f"DIFFER ({sum((hashes - ref).values())} of {row['docs']:,} docs)")
            results.append(row)
            if "error" in row:
                print(f"{label:<36} {w:>7} FAILED: {row['error']}", flush=True)
            else:
                cores = f"{row['cpu_s'] / row['seconds']:.2f}" if "cpu_s" in row else "-"
                print(f"{label:<36} {w:>7} {row['mb_per_s']:>10.2f} {row['tokens_per_s'] / 1e6:>8.2f} {cores:>6} "
                      f"{row['peak_mb']:>8.0f} {row['ids']:>18}", flush=True)
    ratios = compute_ratios(results)
    print("\nratios (same run)")
    for line in ratios["lines"]:
        print("  " + line)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"jsonl_bytes": jsonl, "text_bytes": text, "quick": args.quick, "machine": machine(),
                   "results": results, "ratios": ratios,
                   "command": "python tools/bench_tokenize.py" + (" --quick" if args.quick else "")}, f, indent=1)
    print(f"\nresults: {os.path.relpath(args.json, ROOT)}")
    return 0


def compute_ratios(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    get = lambda peer, setting, w: next((r for r in ok if (r["peer"], r["setting"], r["workers"]) == (peer, setting, w)), None)  # noqa: E731
    out: dict = {"lines": []}
    for w in sorted({r["workers"] for r in ok}):
        ours = get(*OURS, w)
        if not ours:
            continue
        engine = ours.get("engine") or "tiktoken"
        raw = get(RAW, "tiktoken" if "tiktoken" in str(engine) else "tokenizers", w)
        if raw:
            x = ours["mb_per_s"] / raw["mb_per_s"]
            out[f"raw_{w}"] = x
            out["lines"].append(f"{w} worker(s): ours ({engine}) = {x:.0%} of its raw engine "
                                f"(target >= 90%: {'met' if x >= 0.9 else 'NOT met'})")
        peers = [r for r in ok if r["peer"] not in (RAW, OURS[0]) and r["workers"] == w]
        if peers:
            best = max(peers, key=lambda r: r["mb_per_s"])
            x = ours["mb_per_s"] / best["mb_per_s"]
            same = ours.get("ids_identical") and best.get("ids_identical")
            out[f"peer_{w}"], out[f"best_peer_{w}"] = x, best["label"]
            out["lines"].append(f"{w} worker(s): ours = {x:.2f}x the fastest peer ({best['label']}); token ids "
                                f"{'identical' if same else 'NOT identical'} (target >= 4x: {'met' if x >= 4 and same else 'NOT met'})")
        hf = get(OURS[0], "hf", w)
        if hf and peers:
            out["lines"].append(f"{w} worker(s): ours with --engine hf (the peers' engine) = "
                                f"{hf['mb_per_s'] / best['mb_per_s']:.2f}x the fastest peer")
    a, b = get(*OURS, 1), get(*OURS, 2)
    if a and b:
        x = b["mb_per_s"] / a["mb_per_s"]
        out["scaling"] = x
        out["lines"].append(f"ours, 1 -> 2 workers: {x:.2f}x (target >= 1.8x: {'met' if x >= 1.8 else 'NOT met'})")
    return out


if __name__ == "__main__":
    sys.exit(main())
