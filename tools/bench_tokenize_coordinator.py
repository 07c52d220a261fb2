"""The coordinator's share of `dataflow tokenize`'s CPU, the per-node ceiling it implies, and a projection.

`dataflow tokenize` is run (in a child process that calls it as the CLI does) on two sizes of the same kind
of corpus: KJV copies, each with its own letter substitution (distinct words), as uncompressed JSONL files,
GPT-2 `tokenizer.json`, `--workers 2` by default. For each run the child reports the CPU time of its own
process (`getrusage(RUSAGE_SELF)`: the coordinator, with its reader and feeder threads) and of its worker
processes (`RUSAGE_CHILDREN`). The marginal figures, large run minus small run, cancel the fixed start
(imports, tokenizer load and proof, pool start). Runs are repeated (`--repeat`) in interleaved rounds (small,
then large), and each figure is the median of its runs; the share of each round is printed too:

  coordinator share = d(self CPU) / d(self + children CPU)     (the done-when: at most 3% at 2 workers)
  coordinator ceiling = d(text bytes) / d(self CPU)             (the node can never tokenize faster)
  worker rate = d(text bytes) / d(children CPU)                 (per busy core)
  projection(n cores) = min(n x worker rate, ceiling)

It also reports, for the large corpus as one `.jsonl.zst` file, that file's serial ceiling: the rate at which
one process decompresses it, cuts it into pieces and spills them (what the coordinator does for a compressed
file it shares out), and the coordinator's marginal share again with the corpus as ZST_FILES `.jsonl.zst`
files (enough per worker that each worker reads its own files whole: the coordinator should decompress nothing).

    python tools/bench_tokenize_coordinator.py                  # 55 and 176 MB, as the issue measured
    python tools/bench_tokenize_coordinator.py --mb 8,24 --repeat 1   # quick
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import repo_data  # noqa: E402
from tools.bench_tokenize import single_zst, write_corpus  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from dataflow.preprocess import run
from dataflow.preprocess.run import TokenizeConfig, tokenize
inputs, out, tokenizer, workers = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
cpu = lambda: sum(resource.getrusage(resource.RUSAGE_SELF)[:2])
commit_all, committing = run._commit_all, []
def timed(*args):  # this process's CPU from its first commit to its last: its work per token, if any
    start = cpu()
    try:
        return commit_all(*args)
    finally:
        committing.append(cpu() - start)
run._commit_all = timed
t = time.perf_counter()
s = tokenize(TokenizeConfig(inputs=[inputs], out=out, tokenizer=tokenizer, workers=workers, progress=False,
                            overwrite=True))
wall = time.perf_counter() - t
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"self": me.ru_utime + me.ru_stime, "children": kids.ru_utime + kids.ru_stime, "wall": wall,
                  "committing": sum(committing), "text_bytes": s.text_bytes, "tokens": s.tokens,
                  "engine": s.engine}))
"""


def measure(inputs: str, out: str, tokenizer: str, workers: int) -> dict:
    """One tokenize run in a fresh process: its own CPU, its workers' CPU, its wall time and text bytes."""
    env = dict(os.environ, RAYON_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false", PYTHONWARNINGS="ignore")
    p = subprocess.run([sys.executable, "-c", CHILD, inputs, out, tokenizer, str(workers)], capture_output=True,
                       text=True, env=env, cwd=ROOT)
    if p.returncode:
        raise SystemExit(f"tokenize failed: {p.stderr.strip()[-2000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


ZST_FILES = 8


def steady(runs: list[dict]) -> dict:
    """The median of each figure of `runs` (of one size and kind): the fixed start (tokenizer load, sample
    check) moves by +-0.3 CPU-s from run to run here, as much as the marginal it must cancel."""
    return {k: statistics.median(r[k] for r in runs) if isinstance(runs[0][k], (int, float)) else runs[0][k]
            for k in runs[0]}


def paired_shares(small: list[dict], large: list[dict]) -> list[float]:
    """The coordinator's marginal share of each round (its small run against its large run, measured one after
    the other): rounds interleave the sizes, so a machine that grows busier mid-benchmark moves both alike."""
    return [marginal(a, b)[3] for a, b in zip(small, large)]


def many_zst(work: str, files: int = ZST_FILES) -> str:
    """The corpus's JSONL parts as `files` .jsonl.zst files (part k in file k % files), in WORK/zst/."""
    import zstandard

    src, out = os.path.join(work, "input"), os.path.join(work, "zst")
    parts = sorted(os.listdir(src))
    os.makedirs(out, exist_ok=True)
    for k in range(files):
        path = os.path.join(out, f"part-{k}.jsonl.zst")
        if not os.path.exists(path):
            with open(path + ".tmp", "wb") as raw, zstandard.ZstdCompressor(level=3).stream_writer(raw) as w:
                for name in parts[k::files]:
                    with open(os.path.join(src, name), "rb") as f:
                        w.write(f.read())
            os.replace(path + ".tmp", path)
    return out


def marginal(small: dict, large: dict) -> tuple[float, float, float, float]:
    """GB of text, coordinator CPU-s and worker CPU-s between two runs, and the coordinator's share."""
    d_text = (large["text_bytes"] - small["text_bytes"]) / 1e9
    d_self, d_kids = large["self"] - small["self"], large["children"] - small["children"]
    return d_text, d_self, d_kids, d_self / max(d_self + d_kids, 1e-9)


def decompression_ceiling(path: str, piece_bytes: int = 32 << 20) -> float:
    """MB/s of decompressed text one process gets out of `path`, cut into pieces and spilled to files as the
    coordinator does for a local pool (CPU time; each file deleted at once, as its worker would)."""
    import tempfile

    from dataflow.sources import pieces
    from dataflow.preprocess.plan import plan_units

    unit = plan_units([path], piece_bytes)[0]
    with tempfile.TemporaryDirectory(dir=os.path.dirname(path)) as spill:
        start, size = time.process_time(), 0
        for piece in pieces(unit, piece_bytes, spill_dir=spill):
            size += piece.size
            os.remove(piece.spill)
        return size / 1e6 / max(time.process_time() - start, 1e-9)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", default="55,176", help="the two corpus sizes, MB of JSONL")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeat", type=int, default=5, help="rounds of runs (each size and kind); each figure is their median")
    p.add_argument("--work", default=os.path.join(ROOT, "bench-out", "coordinator"))
    p.add_argument("--json", default=os.path.join(ROOT, "bench-out", "results", "tokenize_coordinator.json"))
    args = p.parse_args()
    sizes = [float(x) for x in args.mb.split(",")]
    if len(sizes) != 2 or sizes[0] >= sizes[1]:
        raise SystemExit("--mb takes two sizes, the smaller first (e.g. 55,176)")
    gpt2 = str(repo_data.gpt2_json())
    corpora = []
    for mb in sizes:
        work = os.path.join(args.work, f"{mb:.0f}M")
        write_corpus(work, mb, distinct=True)
        corpora.append((mb, work, os.path.join(work, "input"), many_zst(work)))
    # rounds of (small JSONL, small .zst files, large JSONL, large .zst files): interleaved, so that the machine's
    # load, which drifts over a minute here, weighs on both sizes alike
    measured: dict[tuple[int, str], list[dict]] = {}
    for _ in range(max(args.repeat, 1)):
        for k, (mb, work, jsonl, zst_dir) in enumerate(corpora):
            for kind, inputs in (("JSONL", jsonl), (f"{ZST_FILES} .zst", zst_dir)):
                measured.setdefault((k, kind), []).append(measure(inputs, os.path.join(work, "out"), gpt2,
                                                                  args.workers))
    runs, zst_runs = [], []
    for k, (mb, *_rest) in enumerate(corpora):
        for kind, into in (("JSONL", runs), (f"{ZST_FILES} .zst", zst_runs)):
            r = steady(measured[(k, kind)])
            into.append(r)
            print(f"{mb:>5.0f} MB, {kind:>7}: {r['text_bytes'] / 1e6:7.1f} MB of text, wall {r['wall']:6.1f} s, "
                  f"coordinator {r['self']:6.2f} CPU-s, workers {r['children']:7.2f} CPU-s ({r['engine']}; "
                  f"medians of {len(measured[(k, kind)])})", flush=True)
    rounds = paired_shares(measured[(0, "JSONL")], measured[(1, "JSONL")])
    d_text, d_self, d_kids, share = marginal(*runs)
    share_rounds = statistics.median(rounds)
    zst_share = marginal(*zst_runs)[3]
    ceiling = d_text * 1e3 / max(d_self, 1e-9)  # MB/s
    per_core = d_text * 1e3 / max(d_kids, 1e-9)
    zst = decompression_ceiling(single_zst(os.path.join(args.work, f"{sizes[1]:.0f}M")))
    print(f"\nmarginal, {sizes[0]:.0f} -> {sizes[1]:.0f} MB, --workers {args.workers}:")
    if d_self >= 0:
        print(f"  coordinator: {d_self / max(d_text, 1e-9):.2f} CPU-s per GB of text, {share:.1%} of all the CPU "
              f"(target: at most 3%)")
    else:  # the larger run's coordinator spent less: its fixed start (imports, tokenizer load) moved more
        print(f"  coordinator: 0.00 CPU-s per GB of text, 0.0% of all the CPU (target: at most 3%); its CPU "
              f"fell by {-d_self:.2f} s from the smaller run to the larger, the noise of its fixed start")
    print(f"  the coordinator's share round by round (its small run, then its large): "
          f"{', '.join(f'{x:+.1%}' for x in rounds)}; median {share_rounds:+.1%} (below 0: the large run's coordinator "
          f"spent less, the noise of its fixed start)")
    committing = runs[1]["committing"] / (runs[1]["text_bytes"] / 1e9)
    print(f"  coordinator while it commits (first commit to last, {sizes[1]:.0f} MB): {committing:.2f} CPU-s per GB "
          f"of text, {runs[1]['committing'] / (runs[1]['self'] + runs[1]['children']):.1%} of the run's CPU")
    if d_self > 0:
        print(f"  per-node ceiling set by the coordinator: {ceiling:,.0f} MB/s of text")
    else:  # the coordinator's marginal CPU is below the noise of its fixed start
        ceiling = float("inf")
        print("  per-node ceiling set by the coordinator: none measurable (its marginal CPU is within the noise)")
    print(f"  workers: {per_core:.1f} MB/s of text per busy core")
    for cores in (16, 64):
        projected = min(cores * per_core, ceiling)
        print(f"  {cores} cores: {projected:,.0f} MB/s projected ({projected / (cores * per_core):.0%} of what "
              f"{cores} workers could do)")
    print(f"  one .jsonl.zst file: serial decompression ceiling {zst:,.0f} MB/s of text (one process reads it)")
    print(f"  {ZST_FILES} .jsonl.zst files: the coordinator's share {max(zst_share, 0):.1%} of all the CPU (each "
          f"worker decompresses its own files)")
    print("  (figures as measured on this machine; a shared, loaded machine makes them noisy)")
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json, "w") as f:
        json.dump({"sizes_mb": sizes, "workers": args.workers, "runs": runs, "coordinator_share": share,
                   "coordinator_cpu_s_per_gb": d_self / max(d_text, 1e-9), "ceiling_mb_s": ceiling,
                   "committing_cpu_s_per_gb": committing, "coordinator_share_rounds": rounds,
                   "worker_mb_s_per_core": per_core, "zst_decompression_mb_s": zst,
                   "zst_files": ZST_FILES, "zst_runs": zst_runs, "zst_files_coordinator_share": zst_share,
                   "projection_mb_s": {c: min(c * per_core, ceiling) for c in (16, 64)}}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
