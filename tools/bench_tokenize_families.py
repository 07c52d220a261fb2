"""Tokenize speed for every tokenizer family: the whole `dataflow tokenize` command against its raw engine and raw
`tokenizers`, on the same documents, in the same run.

Families: GPT-2 (tests/data, via tools/repo_data.py) and the test tokenizers of tests/data/tokenizers/ (Llama-3,
Qwen2.5, Llama-2, Mistral). Corpora, one JSONL file each:
  kjv    the KJV corpus (tests/data/kjv.jsonl.zst) repeated to --mb megabytes of text (ids made unique)
  code   this machine's Python standard library `.py` sources and the installed packages' docs (METADATA, .md,
         .rst, .txt), one file a document, in a fixed shuffled order, repeated to --mb: long documents, code
For each family and N in --workers:
  ours            `python -m dataflow tokenize INPUT -o OUT --tokenizer T --workers N` as a subprocess (through a
                  two-line wrapper that also reports the main process's own CPU): wall time, and the CPU of all its
                  processes from getrusage(RUSAGE_CHILDREN); start-up, reading, writing and the proof all included;
                  imported modules' bytecode cached (see PYCACHE), as on a user's second run
  raw engine      the engine the command ran (its summary's `engine`: gigatoken, tiktoken, or tokenizers for hf),
                  built as our engine builds it, in N forked processes that each encode 1/N of the texts, parsed
                  before the clock starts, 64 documents a call, one thread, each call's ids counted and dropped
                  (as a consumer that streams them: holding every id of the corpus makes raw pay for memory growth,
                  not encoding: 8.4 against 2.9 CPU-s/GB on 1 GB of KJV); wall from the first start to the last
                  end, CPU the sum of the processes' CPU
  raw tokenizers  `Tokenizer.encode_batch(add_special_tokens=False)` at one thread (RAYON_NUM_THREADS=1), once
Ratios are given on CPU time (MB of text per CPU-second, steady on a shared machine) and on wall time. The
coordinator's CPU (the main process: reader, feeder, commits) against the workers' CPU is given per GB of text,
and, unless --quick, its marginal per GB (the run minus a run on the first 50 documents, which cancels the fixed
start), with the node ceiling it implies and a projection to 64 cores: min(64 / worker CPU-s per GB, 1 /
coordinator CPU-s per GB) GB/s.

    python tools/bench_tokenize.py families                       # 20 MB per corpus, all families, 1 and 2 workers
    python tools/bench_tokenize.py families --quick --families gpt2 --corpora kjv      # a few hundred KB
    python tools/bench_tokenize.py families --large   # 1 GB of KJV, gpt2, 1 worker: start-up ~5% of the run
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import json
import os
import random
import resource
import subprocess
import sys
import sysconfig
import tempfile
import time

os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one engine thread, before any engine is imported (forks inherit)
os.environ["RAYON_NUM_THREADS"] = "1"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from tools import repo_data  # noqa: E402
from tools.peers.procs import machine, run_forked  # noqa: E402

FAMILIES = ("gpt2", "llama3", "qwen2", "llama2", "mistral")
BYTE_LEVEL = ("gpt2", "llama3", "qwen2")
CHUNK = 64  # documents per raw call, as tools/bench_tokenize_gigatoken.py
TINY_DOCS = 50
MAX_DOC = 1 << 20  # a source file larger than this is left out of the code corpus
# Bytecode of every module the command imports, kept here: an environment without it (PYTHONDONTWRITEBYTECODE set,
# packages installed by uv, which compiles none by default) compiles awkward & co from source at every start,
# ~0.7 CPU-s of a ~1.7 CPU-s start on this machine, which a user's second run never pays. A warm-up run fills it.
PYCACHE = os.path.join(ROOT, "bench-out", "pycache")
# the command, with the main process's own CPU written to $BENCH_RUSAGE once the command's work is done
WRAPPER = ("import gc, json, os, resource, sys\nfrom dataflow.cli import main\ncode = main(sys.argv[1:])\n"
           "me = resource.getrusage(resource.RUSAGE_SELF)\n"
           "json.dump({'self': me.ru_utime + me.ru_stime}, open(os.environ['BENCH_RUSAGE'], 'w'))\n"
           "gc.freeze()\nsys.exit(code)\n")


def tokenizer_path(family: str) -> str:
    if family == "gpt2":
        return str(repo_data.gpt2_json())
    return str(repo_data.DATA / "tokenizers" / family / "tokenizer.json")


def kjv_docs() -> list[dict]:
    import zstandard

    with open(repo_data.KJV, "rb") as f:
        raw = zstandard.ZstdDecompressor().stream_reader(f).read()
    return [json.loads(line) for line in raw.splitlines() if line.strip()]


def code_docs() -> list[dict]:
    """This machine's standard library sources and installed packages' docs, one file a document."""
    stdlib, purelib = sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["purelib"]
    paths = []
    for base, keep in ((stdlib, lambda n: n.endswith(".py")),
                       (purelib, lambda n: n == "METADATA" or n.endswith((".md", ".rst", ".txt")))):
        for d, dirs, names in os.walk(base):
            dirs[:] = sorted(x for x in dirs if x != "site-packages" or base == purelib)
            paths += [os.path.join(d, n) for n in sorted(names) if keep(n)]
    random.Random(0).shuffle(paths)
    docs = []
    for p in paths:
        try:
            if os.path.getsize(p) > MAX_DOC:
                continue
            with open(p, encoding="utf-8") as f:
                text = f.read()
        except (OSError, UnicodeDecodeError):
            continue
        if text.strip():
            docs.append({"id": os.path.relpath(p, os.path.dirname(stdlib)), "text": text})
    return docs


def write_corpus(work: str, name: str, mb: float) -> tuple[str, str, list[str]]:
    """`name`'s documents repeated (or cut) to `mb` MB of text as work/NAME.jsonl, and its first TINY_DOCS
    documents as work/NAME-tiny.jsonl; returns both paths and the texts."""
    base = kjv_docs() if name == "kjv" else code_docs()
    texts, out, size, copy = [], [], 0, 0
    while size < mb * 1e6:
        for doc in base:
            if size >= mb * 1e6:
                break
            texts.append(doc["text"])
            out.append(json.dumps({"id": f"{copy}-{doc['id']}", "text": doc["text"]}) + "\n")
            size += len(doc["text"].encode("utf-8"))
        copy += 1
    path, tiny = os.path.join(work, f"{name}.jsonl"), os.path.join(work, f"{name}-tiny.jsonl")
    for p, lines in ((path, out), (tiny, out[:TINY_DOCS])):
        with open(p + ".tmp", "w", encoding="utf-8") as f:
            f.writelines(lines)
        os.replace(p + ".tmp", p)
    return path, tiny, texts


def run_ours(inputs: str, out: str, tokenizer: str, workers: int, timeout: float) -> dict:
    """The whole command as a subprocess: wall, all its processes' CPU, the main process's own CPU, its summary."""
    fd, rusage = tempfile.mkstemp(prefix="bench-rusage-", suffix=".json")
    os.close(fd)
    cmd = [sys.executable, "-c", WRAPPER, "tokenize", inputs, "-o", out, "--overwrite", "--tokenizer", tokenizer,
           "--workers", str(workers), "--no-progress", "--json"]
    env = dict(os.environ, BENCH_RUSAGE=rusage, PYTHONWARNINGS="ignore", PYTHONPYCACHEPREFIX=PYCACHE)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # see PYCACHE
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        if p.returncode:
            lines = p.stderr.strip().splitlines()
            raise RuntimeError(f"dataflow tokenize exit {p.returncode}: {lines[-1] if lines else 'no output'}")
        with open(rusage) as f:
            coordinator = json.load(f)["self"]
    finally:
        os.remove(rusage)
    summary = json.loads(p.stdout)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return {"wall_s": wall, "cpu_s": cpu, "coordinator_cpu_s": coordinator, "workers_cpu_s": cpu - coordinator,
            "engine": summary["engine"], "tokens": summary["tokens"], "docs": summary["documents"],
            "text_bytes": summary["text_bytes"]}


def _raw_worker(setting: tuple[str, str], texts: list[str], barrier, out) -> None:
    """One raw engine process: build the engine as ours builds it, then encode `texts`, timed (wall and CPU)."""
    try:
        encode = _raw_engine(*setting)
        barrier.wait()
    except BaseException as e:  # the others must not wait at the barrier for a process that is gone
        barrier.abort()
        out.put(("error", f"raw {setting[0]}: {type(e).__name__}: {e}"))
        return
    t0, c0 = time.perf_counter(), time.process_time()
    tokens = sum(count(encode(texts[i:i + CHUNK])) for i in range(0, len(texts), CHUNK))
    t1, c1 = time.perf_counter(), time.process_time()
    out.put((t0, t1, c1 - c0, tokens))


def count(batch) -> int:
    """Tokens in one call's ids: a list of lists, or gigatoken's awkward array (from its offsets: iterating it
    is slow)."""
    if isinstance(batch, list):
        return sum(map(len, batch))
    import awkward as ak

    offsets = ak.to_layout(batch).offsets.data
    return int(offsets[-1] - offsets[0])


def _raw_engine(kind: str, spec: str):
    """The encode function of one raw engine, built as our engine builds it (same JSON, same options)."""
    if kind == "tokenizers":
        from tokenizers import Tokenizer

        hf = Tokenizer.from_file(spec)
        hf.encode_special_tokens = True  # special-token strings in text are text, as tokenize's reference
        encode = lambda b: [e.ids for e in hf.encode_batch(b, add_special_tokens=False)]  # noqa: E731
    else:
        from dataflow.tokenizers.load import load_tokenizer

        fast = load_tokenizer(spec, engine=kind, threads=1)._fast
        if kind == "gigatoken":
            import gigatoken

            tok = gigatoken.Tokenizer.from_json(fast.json_text)
            encode = lambda b: tok.encode_batch(b, parallel=False)  # noqa: E731
        else:
            encode = lambda b: fast.enc.encode_ordinary_batch(b, num_threads=1)  # noqa: E731
    return encode


def run_raw(kind: str, spec: str, texts: list[str], workers: int) -> dict:
    parts = run_forked(_raw_worker, (kind, spec), texts, workers)
    failed = [p[1] for p in parts if p[0] == "error"]
    if failed:
        raise RuntimeError(failed[0])
    return {"wall_s": max(p[1] for p in parts) - min(p[0] for p in parts), "cpu_s": sum(p[2] for p in parts),
            "tokens": sum(p[3] for p in parts)}


def bench_family(family: str, corpus: str, paths: tuple[str, str], texts: list[str], workers: list[int],
                 work: str, marginal: bool, timeout: float, tokenizers_mb: float | None = None) -> list[dict]:
    """Rows for one family on one corpus: raw tokenizers once (on the first `tokenizers_mb` MB of text if given: a
    rate, slow to take on a GB), then per N raw engine, ours (and ours on tiny)."""
    sizes = list(itertools.accumulate(len(t.encode("utf-8")) for t in texts))
    spec, mb = tokenizer_path(family), sizes[-1] / 1e6
    rate = lambda r, mb: {"mb_s": mb / r["wall_s"], "mb_cpu_s": mb / r["cpu_s"]}  # noqa: E731
    n = bisect.bisect_left(sizes, tokenizers_mb * 1e6) + 1 if tokenizers_mb else len(texts)
    hf = run_raw("tokenizers", spec, texts[:n], 1) | {"text_mb": sizes[min(n, len(texts)) - 1] / 1e6}
    hf |= rate(hf, hf["text_mb"])
    rows = []
    for n in workers:
        out = os.path.join(work, f"out-{corpus}-{family}-{n}")
        ours = run_ours(paths[0], out, spec, n, timeout)
        ours |= rate(ours, mb)
        kind = {"hf": "tokenizers"}.get(ours["engine"], ours["engine"])
        raw = run_raw(kind, spec, texts, n)
        raw |= rate(raw, mb)
        row = {"family": family, "corpus": corpus, "workers": n, "text_mb": mb, "engine": ours["engine"],
               "ours": ours, "raw": raw, "raw_tokenizers": hf}
        if marginal:
            row["tiny"] = run_ours(paths[1], out + "-tiny", spec, n, timeout)
        rows.append(row)
        print_row(row, flush=True)
    return rows


def print_header() -> None:
    print(f"{'family':<8} {'engine':<10} {'N':>2} {'ours MB/s':>10} {'MB/CPU-s':>9} {'raw MB/s':>9} {'MB/CPU-s':>9} "
          f"{'tok 1-thr':>9} | {'ours/raw cpu':>12} {'wall':>6} | {'ours/tok cpu':>12} {'wall':>6} | "
          f"{'framing tok/doc':>15}")


def print_row(r: dict, flush: bool = False) -> None:
    o, raw, hf = r["ours"], r["raw"], r["raw_tokenizers"]
    framing = (o["tokens"] - raw["tokens"]) / max(o["docs"], 1)  # EOS (and BOS) per document; ids: the tests
    print(f"{r['family']:<8} {r['engine']:<10} {r['workers']:>2} {o['mb_s']:>10.2f} {o['mb_cpu_s']:>9.2f} "
          f"{raw['mb_s']:>9.2f} {raw['mb_cpu_s']:>9.2f} {hf['mb_s']:>9.2f} | "
          f"{o['mb_cpu_s'] / raw['mb_cpu_s']:>12.2f} {o['mb_s'] / raw['mb_s']:>6.2f} | "
          f"{o['mb_cpu_s'] / hf['mb_cpu_s']:>12.1f} {o['mb_s'] / hf['mb_s']:>6.1f} | {framing:>15.2f}", flush=flush)


def start_excluded(r: dict) -> float | None:
    """Ours in MB of text per CPU-s with the fixed start cancelled (the run minus its tiny run, all processes' CPU);
    None without a tiny run, or where the difference is within the noise (<= 0)."""
    if "tiny" not in r:
        return None
    o, t = r["ours"], r["tiny"]
    cpu = o["cpu_s"] - t["cpu_s"]
    return (o["text_bytes"] - t["text_bytes"]) / 1e6 / cpu if cpu > 0 else None


def cpu_lines(rows: list[dict]) -> list[str]:
    """The coordinator's and the workers' CPU-s per GB of text (whole run; marginal over the tiny run if any)."""
    lines = [f"{'family':<8} {'N':>2} {'coord CPU-s/GB':>14} {'workers CPU-s/GB':>16} {'coord share':>11}"
             + (f" {'marg coord/GB':>13} {'marg work/GB':>12} {'ceiling GB/s':>12} {'64 cores GB/s':>13}"
                if any("tiny" in r for r in rows) else "")]
    for r in rows:
        o, gb = r["ours"], r["text_mb"] / 1e3
        line = (f"{r['family']:<8} {r['workers']:>2} {o['coordinator_cpu_s'] / gb:>14.1f} "
                f"{o['workers_cpu_s'] / gb:>16.1f} {o['coordinator_cpu_s'] / o['cpu_s']:>11.1%}")
        if "tiny" in r:
            t = r["tiny"]
            dgb = (o["text_bytes"] - t["text_bytes"]) / 1e9
            coord = (o["coordinator_cpu_s"] - t["coordinator_cpu_s"]) / dgb
            workers = (o["workers_cpu_s"] - t["workers_cpu_s"]) / dgb
            r["marginal"] = {"coordinator_cpu_s_per_gb": coord, "workers_cpu_s_per_gb": workers}
            if coord > 0:
                proj = min(64 / workers, 1 / coord)
                line += f" {coord:>13.1f} {workers:>12.1f} {1 / coord:>12.2f} {proj:>13.2f}"
            else:
                line += f" {coord:>13.1f} {workers:>12.1f} {'(noise: <=0)':>12} {64 / workers:>13.2f}"
        lines.append(line)
    return lines


def goal_lines(rows: list[dict]) -> list[str]:
    """Issue 34's bars, at one worker: byte-level within 0.5 of raw and >= 10x raw tokenizers; SentencePiece-style
    at least raw tokenizers' speed. Judged on CPU time and on wall time; each said met or NOT met."""
    lines = []
    for r in (r for r in rows if r["workers"] == 1):
        o, raw, hf = r["ours"], r["raw"], r["raw_tokenizers"]
        said = lambda x, bar: f"{x:.2f} ({'met' if x >= bar else 'NOT met'})"  # noqa: E731
        steady = start_excluded(r)
        if steady:
            lines.append(f"{r['corpus']:<5} {r['family']:<8} start excluded: ours {steady:.1f} MB/CPU-s = "
                         f"{steady / raw['mb_cpu_s']:.2f} of raw {r['engine']}, {steady / hf['mb_cpu_s']:.1f}x raw "
                         f"tokenizers")
        if r["family"] in BYTE_LEVEL:
            lines.append(f"{r['corpus']:<5} {r['family']:<8} ours/raw {r['engine']} >= 0.5: cpu "
                         f"{said(o['mb_cpu_s'] / raw['mb_cpu_s'], 0.5)}, wall {said(o['mb_s'] / raw['mb_s'], 0.5)}; "
                         f"ours/raw tokenizers >= 10: cpu {said(o['mb_cpu_s'] / hf['mb_cpu_s'], 10)}, wall "
                         f"{said(o['mb_s'] / hf['mb_s'], 10)}")
        else:
            lines.append(f"{r['corpus']:<5} {r['family']:<8} ours/raw tokenizers >= 1: cpu "
                         f"{said(o['mb_cpu_s'] / hf['mb_cpu_s'], 1)}, wall {said(o['mb_s'] / hf['mb_s'], 1)}")
    for corpus in sorted({r["corpus"] for r in rows}):
        for fam in FAMILIES:
            by_n = {r["workers"]: r for r in rows if r["corpus"] == corpus and r["family"] == fam}
            if 1 in by_n and 2 in by_n:
                g = lambda k: by_n[2][k]["mb_s"] / by_n[1][k]["mb_s"]  # noqa: E731
                lines.append(f"{corpus:<5} {fam:<8} 1 -> 2 workers (wall): ours {g('ours'):.2f}x, raw {g('raw'):.2f}x")
    return lines


def markdown(d: dict) -> list[str]:
    """The results file as docs/benchmarks.md's section: one table row per (corpus, family, workers), the goal lines
    and the CPU accounting. A --quick file is said to be start-up alone: it cannot judge the goals."""
    rows = d["rows"]
    lines = [f"`{d['command'].strip()}`: {d['mb']:g} MB of text per corpus (kjv: the KJV repeated; code: this "
             "machine's Python sources and package docs, long documents), one engine thread per process. "
             "Whole command: `dataflow tokenize` as a subprocess, start-up, reading, writing and the proof included. "
             "Raw: the engine the command ran, texts parsed before the clock, nothing written. "
             "'start excluded': the run minus a 50-document run, all processes' CPU (cancels the fixed start, "
             "~1 CPU-s here).", ""]
    if d.get("quick"):
        lines += ["*A --quick run: its figures are start-up alone and cannot judge the goals below.*", ""]
    lines += ["| corpus | family | engine | workers | ours MB/s | ours/raw (CPU) | ours/raw (wall) | start excluded "
              "ours/raw (CPU) | ours/raw tokenizers (CPU) | framing tokens/doc |", "|---|---|---|---:|---:|---:|---:|"
              "---:|---:|---:|"]
    for r in rows:
        o, raw, hf = r["ours"], r["raw"], r["raw_tokenizers"]
        steady = start_excluded(r)
        steady = "-" if "tiny" not in r else "(noise)" if steady is None else f"{steady / raw['mb_cpu_s']:.2f}"
        lines.append(f"| {r['corpus']} | {r['family']} | {r['engine']} | {r['workers']} | {o['mb_s']:.1f} | "
                     f"{o['mb_cpu_s'] / raw['mb_cpu_s']:.2f} | {o['mb_s'] / raw['mb_s']:.2f} | {steady} | "
                     f"{o['mb_cpu_s'] / hf['mb_cpu_s']:.1f}x | {(o['tokens'] - raw['tokens']) / max(o['docs'], 1):.2f} |")
    lines += ["", "Against issue 34's bars at one worker (byte-level: >= 0.5 of the raw engine and >= 10x raw "
              "`tokenizers`; SentencePiece-style: >= raw `tokenizers`):", ""]
    lines += [f"- {x.strip()}" for x in goal_lines(rows)]
    lines += ["", "CPU accounting (the coordinator is the main process: its per-GB cost is the serial part):", "",
              "```"] + cpu_lines(rows) + ["```", ""]
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mb", type=float, default=20.0, help="MB of text per corpus (default 20)")
    p.add_argument("--families", default=",".join(FAMILIES))
    p.add_argument("--corpora", default="kjv,code")
    p.add_argument("--workers", default="1,2")
    p.add_argument("--quick", action="store_true", help="0.3 MB per corpus, no warm-up and no marginal (tiny) runs")
    p.add_argument("--work", default=os.path.join(ROOT, "bench-out", "tokenize-families"))
    p.add_argument("--json", default=os.path.join(ROOT, "bench-out", "results", "tokenize-families.json"))
    p.add_argument("--timeout", type=float, default=1200.0)
    p.add_argument("--tokenizers-mb", type=float, default=None, help="raw tokenizers on this many MB only (--large)")
    p.add_argument("--large", action="store_true", help="1 GB of text, gpt2 on kjv at 1 worker (start-up ~5%%)")
    args = p.parse_args(argv)
    if args.large:
        args.mb, args.families, args.corpora, args.workers = 1000.0, "gpt2", "kjv", "1"
        args.tokenizers_mb = args.tokenizers_mb or 50.0
    families = [f for f in args.families.split(",") if f]
    unknown = sorted(set(families) - set(FAMILIES)) + sorted(set(args.corpora.split(",")) - {"kjv", "code"})
    if unknown:
        p.error(f"unknown family or corpus: {', '.join(unknown)} (families: {', '.join(FAMILIES)}; corpora: kjv, code)")
    mb = min(args.mb, 0.3) if args.quick else args.mb
    workers = [int(x) for x in args.workers.split(",")]
    os.makedirs(args.work, exist_ok=True)
    info = machine()
    print(f"machine: {info['cpu']}, {info['cores']} CPUs (load average {os.getloadavg()[0]:.1f}: a shared machine "
          f"makes wall times noisy; CPU-time figures are steadier), one engine thread per process", flush=True)
    rows = []
    for corpus in args.corpora.split(","):
        path, tiny, texts = write_corpus(args.work, corpus, mb)
        size = sum(len(t.encode("utf-8")) for t in texts)
        print(f"\ncorpus {corpus}: {len(texts):,} documents, {size / 1e6:.1f} MB of text "
              f"({size / len(texts) / 1e3:.1f} KB a document)", flush=True)
        if not args.quick:  # fills PYCACHE (--quick's figures are start-up alone: for the test that it runs)
            run_ours(tiny, os.path.join(args.work, "warm-up"), tokenizer_path(families[0]), 1, args.timeout)
        print_header()
        for family in families:
            rows += bench_family(family, corpus, (path, tiny), texts, workers, args.work, not args.quick,
                                 args.timeout, args.tokenizers_mb)
        print(f"\nCPU accounting, {corpus} (the coordinator is the main process; its per-GB cost is the serial part)")
        for line in cpu_lines([r for r in rows if r["corpus"] == corpus]):
            print("  " + line)
    print("\nratios ours / raw engine and ours / raw tokenizers (1 thread), against issue 34's bars at one worker")
    for line in goal_lines(rows):
        print("  " + line)
    os.makedirs(os.path.dirname(args.json), exist_ok=True)
    with open(args.json + ".tmp", "w") as f:  # atomic: tools/peers/report.py reads it into docs/benchmarks.md
        json.dump({"machine": info, "mb": mb, "quick": args.quick, "rows": rows,
                   "command": "python tools/bench_tokenize.py families " + " ".join(argv or sys.argv[1:])}, f, indent=1)
    os.replace(args.json + ".tmp", args.json)
    print(f"\nresults: {os.path.relpath(args.json, ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
