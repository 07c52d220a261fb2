"""Tokenize throughput: ours against the raw engines and the peers, same corpus, same run, same machine.

The corpus is the KJV replicated to --mb megabytes of JSONL (one file per copy, ids made unique), tokenized
with the GPT-2 `tokenizer.json`, with 1 and 2 workers. `--corpus distinct` gives each copy its own letter
substitution: the same shape of text, but words never seen in another copy, so an engine's piece cache
(gigatoken's) gains nothing from the replication. Raw gigatoken runs from tools/bench_tokenize_gigatoken.py
(fresh processes; its steady state is printed too), and ours also tokenizes the corpus as one .jsonl.zst
file, which it splits across workers. Each tool runs in its own subprocess
(tools/peers/harness.py) with one engine thread per worker process (RAYON_NUM_THREADS=1,
TOKENIZERS_PARALLELISM=false); its time is taken inside that process around the tool's own call (imports
excluded, reading, tokenizing and writing included); its memory is the peak PSS of its process tree. Every
tool's output is read back and its documents compared, as a multiset of token-id sequences, with
`tokenizers`' ids for the same texts. Our package is byte-compiled first, as pip compiles an installed one
(PYTHONDONTWRITEBYTECODE, set on some machines, would otherwise make every run compile the modules changed
since the last compile). `--repeat N` runs raw gigatoken and ours on the one .jsonl.zst N times, interleaved,
and the two one-file ratios use the medians (issue 20's bars; `make bench` uses 3).

    python tools/bench_tokenize.py            # full: 100 MB
    python tools/bench_tokenize.py --quick    # 30 MB
    python tools/bench_tokenize.py --corpus distinct --only raw_tokenizers,raw_gigatoken,dataflow
    python tools/bench_tokenize.py --mb 180 --corpus distinct --only raw_gigatoken,dataflow:auto --repeat 3

`python tools/bench_tokenize.py families [--quick] [--families gpt2,llama3,...]` measures every tokenizer family
instead: the whole command against its raw engine and raw `tokenizers` (tools/bench_tokenize_families.py).
"""

from __future__ import annotations

import argparse
import collections
import compileall
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import repo_data  # noqa: E402
from tools.peers.procs import machine, run_case  # noqa: E402

HARNESS = os.path.join(ROOT, "tools", "peers", "harness.py")
RAW_GIGATOKEN = os.path.join(ROOT, "tools", "bench_tokenize_gigatoken.py")

# (peer module, setting, label); the first row is the reference for the token-id check
CASES = [
    ("raw_tokenizers", "tokenizers", "raw tokenizers encode_batch"),
    ("raw_tokenizers", "tiktoken", "raw tiktoken encode_ordinary_batch"),
    ("raw_gigatoken", "gigatoken", "raw gigatoken encode_batch (fresh)"),
    ("dataflow", "auto", "dataflow tokenize"),
    ("dataflow", "tiktoken", "dataflow tokenize --engine tiktoken"),
    ("dataflow", "hf", "dataflow tokenize --engine hf"),
    ("litdata", "optimize", "LitData optimize()"),
    ("datatrove", "tokenizer", "datatrove DocumentTokenizer"),
]
RAW = "raw_tokenizers"
OURS = ("dataflow", "auto")
OURS_ONE_FILE = ("dataflow-zst", "dataflow-zst-1cpu")  # ours on the one .jsonl.zst, as a command (and on one CPU)


def write_corpus(work: str, mb: float, distinct: bool = False) -> tuple[int, int]:
    """One JSONL file per copy of the KJV (each with its own letter substitution when `distinct`), and the
    same as one .jsonl.zst file; returns (JSONL bytes, UTF-8 bytes of the texts)."""
    import random
    import string

    import zstandard

    d = os.path.join(work, "input")
    with open(repo_data.KJV, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)
    copies = max(1, round(mb * 1e6 / sum(len(x) for x in lines)))
    text = sum(len(json.loads(x)["text"].encode()) for x in lines) * copies
    if os.path.isdir(d) and len(os.listdir(d)) == copies and os.path.exists(single_zst(work)):
        return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)), text
    os.makedirs(d, exist_ok=True)
    for f in os.listdir(d):
        os.remove(os.path.join(d, f))
    rng = random.Random(0)
    with open(single_zst(work), "wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as single:
        for c in range(copies):
            letters = list(string.ascii_lowercase)
            rng.shuffle(letters)
            swap = "".join(letters)
            table = str.maketrans(string.ascii_letters, swap + swap.upper()) if distinct else None
            with open(os.path.join(d, f"part-{c:04d}.jsonl"), "wb") as f:
                for line in lines:
                    if table:  # the text only: ids and keys stay as they are
                        obj = json.loads(line)
                        obj["text"] = obj["text"].translate(table)
                        line = (json.dumps(obj) + "\n").encode()
                    line = line.replace(b'"id": "', f'"id": "{c}-'.encode(), 1)
                    f.write(line)
                    single.write(line)
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d)), text


def single_zst(work: str) -> str:
    """The whole corpus as one zstd-compressed JSONL file (outside input/, which holds the parts)."""
    return os.path.join(work, "corpus.jsonl.zst")


def run_single_zst(work: str, workers: int, timeout: float, env: dict, cpus: set[int] | None = None) -> dict:
    """Ours on the one .jsonl.zst file: the summary's seconds (tokenize() as the CLI calls it), the whole
    command's wall time (interpreter start and imports included: what a user waits for) and the CPU time of
    all its processes; `cpus`: the CPUs the command may use (all of them by default)."""
    import resource
    import subprocess
    import time

    out = os.path.join(work, f"out-single-zst-{workers}")
    cmd = [sys.executable, "-m", "dataflow", "tokenize", single_zst(work), "-o", out, "--overwrite",
           "--tokenizer", env["BENCH_GPT2_JSON"], "--workers", str(workers), "--no-progress", "--json"]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT, preexec_fn=pin)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # the command's processes, all waited for
    if p.returncode:
        return {"error": p.stderr.strip().splitlines()[-1] if p.stderr.strip() else f"exit {p.returncode}"}
    s = json.loads(p.stdout)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"seconds": s["seconds"], "command_seconds": wall, "command_cpu_s": cpu, "tokens": s["tokens"],
            "docs": s["documents"], "engine": s["engine"]}


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=100)
    p.add_argument("--work", default=None, help="default bench-out/tokenize-<MB>M")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--only", default=None, help="comma-separated peer modules, or peer:setting (dataflow:auto)")
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--quick", action="store_true", help="30 MB")
    p.add_argument("--corpus", choices=("replicated", "distinct"), default="replicated",
                   help="KJV copies as they are, or each with its own letter substitution (distinct words)")
    p.add_argument("--json", default=os.path.join(ROOT, "bench-out", "results", "tokenize.json"))
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of raw gigatoken and ours on the one .jsonl.zst, interleaved; the ratios use medians")
    return p.parse_args()


def compare_ids(row: dict, out: str, ref_hashes: dict[int, collections.Counter], is_reference: bool) -> None:
    """The row's ids against raw tokenizers' of the same worker count (documents' id hashes, as multisets)."""
    w = row["workers"]
    with open(out + ".hashes.json") as f:
        hashes = collections.Counter(json.load(f))
    if is_reference:
        ref_hashes[w] = hashes
    ref = ref_hashes.get(w) or next(iter(ref_hashes.values()), None)
    if ref is None:
        row["ids"] = "no reference"
        return
    diff = sum((hashes - ref).values()) + sum((ref - hashes).values())
    row["ids_identical"] = diff == 0
    row["ids"] = (f"identical ({row['docs']:,} docs)" if diff == 0 else
                  f"DIFFER ({sum((hashes - ref).values())} of {row['docs']:,} docs)")


def main() -> int:
    if sys.argv[1:2] == ["families"]:
        from tools import bench_tokenize_families

        return bench_tokenize_families.main(sys.argv[2:])
    args = parse_args()
    compileall.compile_dir(os.path.join(ROOT, "dataflow"), quiet=1)
    if args.quick:
        args.mb, args.timeout = min(args.mb, 30), 300.0
    distinct = args.corpus == "distinct"
    work = args.work or os.path.join(ROOT, "bench-out", f"tokenize-{args.mb:.0f}M" + ("-distinct" if distinct else ""))
    os.makedirs(work, exist_ok=True)
    jsonl, text = write_corpus(work, args.mb, distinct)
    kind = "KJV copies, each with its own letter substitution" if distinct else "KJV replicated"
    print(f"corpus: {jsonl / 1e6:.0f} MB of JSONL ({text / 1e6:.0f} MB of text; {kind}), GPT-2 tokenizer.json, "
          f"{os.cpu_count()} CPUs, one engine thread per process", flush=True)
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore",
               BENCH_GPT2_JSON=str(repo_data.gpt2_json()))
    only = set(args.only.split(",")) if args.only else None
    cases = [c for c in CASES if only is None or c[0] in only or f"{c[0]}:{c[1]}" in only]
    results = []
    ref_hashes: dict[int, collections.Counter] = {}
    print(f"\n{'tool':<36} {'workers':>7} {'MB text/s':>10} {'Mtok/s':>8} {'cores':>6} {'peak MB':>8} "
          f"{'ids vs tokenizers':>18}",
          flush=True)
    for w in [int(x) for x in args.workers.split(",")]:
        for peer, setting, label in cases:
            out = os.path.join(work, f"result-{peer}-{setting}-{w}.json")
            cmd = [sys.executable, HARNESS, "tokenize-run", peer, setting, "--work", work, "--workers", str(w), "--out", out]
            if peer == "raw_gigatoken":
                cmd = raw_gigatoken_cmd(work, w, out)
            row = {"peer": peer, "setting": setting, "label": label, "workers": w}
            row.update(run_case(cmd, out, args.timeout, env))
            if "error" not in row:
                row["mb_per_s"] = text / 1e6 / row["seconds"]
                row["tokens_per_s"] = row["tokens"] / row["seconds"]
                compare_ids(row, out, ref_hashes, is_reference=peer == RAW and setting == "tokenizers")
            results.append(row)
            print_row(row, label, w)
            if "steady_seconds" in row:
                print(f"{'  (steady state: same texts again)':<36} {w:>7} {text / 1e6 / row['steady_seconds']:>10.2f}",
                      flush=True)
        if only is None or "dataflow" in only or "dataflow:auto" in only:
            for pinned in (False, True) if w == 1 and can_pin() else (False,):
                row = single_zst_row(work, w, args.timeout, env, text, pinned)
                results.append(row)
                print_row(row, row["label"], w)
    if args.repeat > 1:
        repeat_one_file(results, work, args.repeat, args.timeout, env, text)
    ratios = compute_ratios(results)
    print("\nratios (same run)")
    for line in ratios["lines"]:
        print("  " + line)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"jsonl_bytes": jsonl, "text_bytes": text, "quick": args.quick, "machine": machine(),
                   "results": results, "ratios": ratios,
                   "repeat": args.repeat,
                   "command": "python tools/bench_tokenize.py" + (" --quick" if args.quick else "")
                   + (f" --repeat {args.repeat}" if args.repeat > 1 else "")}, f, indent=1)
    print(f"\nresults: {os.path.relpath(args.json, ROOT)}")
    return 0


def raw_gigatoken_cmd(work: str, w: int, out: str) -> list[str]:
    return [sys.executable, RAW_GIGATOKEN, "--work", work, "--workers", str(w), "--out", out]


def single_zst_row(work: str, w: int, timeout: float, env: dict, text: int, pinned: bool = False) -> dict:
    """Ours on the one .jsonl.zst with `w` workers; `pinned`: every process of the run on one CPU."""
    row = {"peer": "dataflow-zst-1cpu" if pinned else "dataflow-zst", "setting": "auto", "workers": w,
           "label": "dataflow ONE.jsonl.zst on 1 CPU" if pinned else "dataflow tokenize ONE.jsonl.zst"}
    row.update(run_single_zst(work, w, timeout, env, cpus={min(os.sched_getaffinity(0))} if pinned else None))
    if "error" not in row:
        row["mb_per_s"], row["tokens_per_s"] = text / 1e6 / row["seconds"], row["tokens"] / row["seconds"]
        row["peak_mb"], row["ids"] = 0, "-"
    return row


def repeat_one_file(results: list[dict], work: str, repeat: int, timeout: float, env: dict, text: int) -> None:
    """Run raw gigatoken and ours on the one .jsonl.zst `repeat - 1` more times, interleaved (raw 1, ours 1, raw 2,
    ours 2, ...), and set each of their rows to the medians of its runs (`runs` keeps every run's seconds)."""
    rows = {(r["peer"], r["workers"]): r for r in results
            if r["peer"] in ("raw_gigatoken", *OURS_ONE_FILE) and "error" not in r}
    runs = {key: [dict(r)] for key, r in rows.items()}
    for _ in range(repeat - 1):
        for (peer, w) in sorted(rows, key=lambda key: (key[1], key[0] != "raw_gigatoken")):
            if peer == "raw_gigatoken":
                out = os.path.join(work, f"result-raw_gigatoken-gigatoken-{w}.json")
                again = run_case(raw_gigatoken_cmd(work, w, out), out, timeout, env)
            else:
                again = single_zst_row(work, w, timeout, env, text, pinned=peer == "dataflow-zst-1cpu")
            if "error" not in again:
                runs[(peer, w)].append(again)
    print(f"\nmedians of {repeat} interleaved runs (raw gigatoken and ours on ONE.jsonl.zst)")
    for (peer, w), row in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        taken = runs[(peer, w)]
        for key in ("seconds", "command_seconds", "command_cpu_s"):
            if key in row:
                row[key] = statistics.median(r[key] for r in taken)
        row["runs"] = [[r["seconds"], r.get("command_seconds")] for r in taken]
        row["mb_per_s"], row["tokens_per_s"] = text / 1e6 / row["seconds"], row["tokens"] / row["seconds"]
        print(f"{row['label']:<36} {w:>7} {row['mb_per_s']:>10.2f}   (runs: "
              + ", ".join(f"{text / 1e6 / r['seconds']:.1f}" for r in taken) + " MB/s)", flush=True)


def can_pin() -> bool:
    """Whether a run can be held to one CPU here (Linux) while another is left for a second worker."""
    return hasattr(os, "sched_setaffinity") and len(os.sched_getaffinity(0)) >= 2


def print_row(row: dict, label: str, w: int) -> None:
    if "error" in row:
        print(f"{label:<36} {w:>7} FAILED: {row['error']}", flush=True)
    else:
        cores = f"{row['cpu_s'] / row['seconds']:.2f}" if "cpu_s" in row else "-"
        print(f"{label:<36} {w:>7} {row['mb_per_s']:>10.2f} {row['tokens_per_s'] / 1e6:>8.2f} {cores:>6} "
              f"{row['peak_mb']:>8.0f} {row['ids']:>18}", flush=True)


def compute_ratios(results: list[dict]) -> dict:
    ok = [r for r in results if "error" not in r]
    get = lambda peer, setting, w: next((r for r in ok if (r["peer"], r["setting"], r["workers"]) == (peer, setting, w)), None)  # noqa: E731
    out: dict = {"lines": []}
    for w in sorted({r["workers"] for r in ok}):
        ours = get(*OURS, w)
        if not ours:
            continue
        engine = ours.get("engine") or "tiktoken"
        raw = get("raw_gigatoken", "gigatoken", w) if engine == "gigatoken" else \
            get(RAW, "tiktoken" if "tiktoken" in str(engine) else "tokenizers", w)
        if raw:
            x = ours["mb_per_s"] / raw["mb_per_s"]
            out[f"raw_{w}"] = x
            target = 0.5 if engine == "gigatoken" else 0.9
            out["lines"].append(f"{w} worker(s): ours ({engine}) = {x:.0%} of its raw engine, fresh process "
                                f"(target >= {target:.0%}: {'met' if x >= target else 'NOT met'})")
        hf_raw = get(RAW, "tokenizers", w)
        if hf_raw:
            x = ours["mb_per_s"] / hf_raw["mb_per_s"]
            out[f"raw_tokenizers_{w}"] = x
            out["lines"].append(f"{w} worker(s): ours = {x:.1f}x raw tokenizers (target >= 10x: "
                                f"{'met' if x >= 10 else 'NOT met'})")
        peers = [r for r in ok if r["peer"] not in (RAW, "raw_gigatoken", OURS[0], *OURS_ONE_FILE) and r["workers"] == w]
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
    for key, peer, what in (("scaling", OURS[0], "JSONL files"), ("scaling_zst", "dataflow-zst", "one .jsonl.zst")):
        a, b = get(peer, "auto", 1), get(peer, "auto", 2)
        if a and b:
            x = b["mb_per_s"] / a["mb_per_s"]
            out[key] = x
            out["lines"].append(f"ours, 1 -> 2 workers on {what}: {x:.2f}x (target >= 1.6x: "
                                f"{'met' if x >= 1.6 else 'NOT met'})")
    out["lines"] += _zst_against_raw(out, get)
    return out


def _zst_against_raw(out: dict, get) -> list[str]:
    """Issue 20's two bars for one .jsonl.zst: what a second worker gains against what a second raw gigatoken
    process gains (>= 0.9 of it), and the whole 2-worker command against raw gigatoken's 2 processes (>= 0.5)."""
    lines = []
    z1, z2 = get("dataflow-zst", "auto", 1), get("dataflow-zst", "auto", 2)
    r1, r2 = get("raw_gigatoken", "gigatoken", 1), get("raw_gigatoken", "gigatoken", 2)
    if z1 and z2 and r1 and r2:
        ours_gain, raw_gain = z2["mb_per_s"] / z1["mb_per_s"], r2["mb_per_s"] / r1["mb_per_s"]
        out["zst_gain_vs_raw"] = x = ours_gain / raw_gain
        cores = f"; our 1-worker run already keeps {z1['command_cpu_s'] / z1['command_seconds']:.2f} CPUs busy" \
            if z1.get("command_cpu_s") else ""
        lines.append(f"one .jsonl.zst, 1 -> 2 workers: ours {ours_gain:.2f}x, raw gigatoken {raw_gain:.2f}x: "
                     f"{x:.2f} of raw's gain (target >= 0.9: {'met' if x >= 0.9 else 'NOT met'}){cores}")
    p1 = get("dataflow-zst-1cpu", "auto", 1)
    if p1 and z2 and r1 and r2:  # raw gigatoken's process is single-threaded: 1 process = 1 CPU
        ours_gain, raw_gain = z2["mb_per_s"] / p1["mb_per_s"], r2["mb_per_s"] / r1["mb_per_s"]
        out["zst_core_gain_vs_raw"] = x = ours_gain / raw_gain
        lines.append(f"one .jsonl.zst, 1 -> 2 CPUs (our 1-worker run held to one CPU, as raw's one process): ours "
                     f"{ours_gain:.2f}x, raw gigatoken {raw_gain:.2f}x: {x:.2f} of raw's gain")
    if z2 and r2 and z2.get("command_seconds"):
        whole = z2["mb_per_s"] * z2["seconds"] / z2["command_seconds"]
        out["zst_command_vs_raw_2"] = x = whole / r2["mb_per_s"]
        lines.append(f"one .jsonl.zst, 2 workers, whole command (start-up included): {whole:.1f} MB/s = {x:.2f} of "
                     f"raw gigatoken's 2 processes ({r2['mb_per_s']:.1f}) (target >= 0.5: "
                     f"{'met' if x >= 0.5 else 'NOT met'})")
    return lines


if __name__ == "__main__":
    sys.exit(main())
