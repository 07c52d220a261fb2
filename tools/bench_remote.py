"""Streaming from object storage: dataflow and its peers against a local S3 server (moto) behind a throttling
proxy of our own.

Per link condition (round trip / shared cap, `tools/bench_remote_proxy.py` on 127.0.0.1) and worker count,
each case in a fresh process with a cold cache, batches of 8 x 2049 tokens, shuffle on, the first epoch:
dataflow's `StreamingDataset("s3://...", seq_len=2048)` and the peers that install here, each over the same
windows converted to its own format (before the clock) and uploaded to the same bucket, read through the same
proxy: MosaicML Streaming (MDS, zstd), LitData (`optimize` with TokensLoader, zstd), WebDataset (gzip tar,
streamed). The peers run in `--peer-python` (.bench-venv, `make bench-setup`); the adapters and the shared
measuring loop are tools/peers/remote_*.py. Measured:
- time to first batch, cold (from making the dataset) and after a resume at half an epoch (fresh cache; "n/a"
  for a loader without resume);
- share of the link's token ceiling over the first epoch, start included (cap / dataflow's compressed bytes
  per token, the same yardstick for every loader);
- bytes fetched (the proxy's count of bytes sent down), cold and after the resume, in multiples of the loader's
  own dataset bytes;
- GET requests; peak memory of the loader's process tree (RSS, polled); the cache's peak bytes on disk (polled);
- what it served: the multiset of window hashes of the epoch against the dataset's ("ok"), and whether the
  samples before the state plus those after the resume are the cold epoch's ("exact").
Then each measure's ratio to the best loader (`--markdown F`: one table of it all). Before the clock, each
loader is warmed up once (one batch straight from the server, untimed) so that no case pays for compiling its
libraries' bytecode (cached in the run's folder) or reading them from disk. Also in the same run: a plain
boto3 download of every shard through the proxy (what the link gives one client) and, with `--baseline-src
DIR` (a checkout of an older dataflow, e.g. `git worktree add /tmp/old HEAD~5`), the same cases on that code.

    python tools/bench_remote.py                          # 4 shards, 32M tokens, 20ms/100MB/s and 100ms/25MB/s
    python tools/bench_remote.py --quick --peers none     # a smoke run: dataflow alone, 2M tokens, one condition
    python tools/bench_remote.py --tokens 16M --conditions 100:25 --workers 0 --baseline-src /tmp/old
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUCKET = "bench"


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def write_dataset(out: str, tokens: int, shards: int) -> str:
    """KJV tokenized with GPT-2 (tests/data), repeated (whole copies) to at least `tokens` tokens, in `shards`
    zstd Arrow shards."""
    import numpy as np
    import zstandard
    from tokenizers import Tokenizer

    sys.path.insert(0, ROOT)
    from dataflow import ShardWriter, TokenizerMeta

    data = os.path.join(ROOT, "tests", "data")
    dctx = zstandard.ZstdDecompressor()
    with open(os.path.join(data, "gpt2-tokenizer.json.zst"), "rb") as f:
        tok = Tokenizer.from_str(dctx.stream_reader(f).read().decode())
    with open(os.path.join(data, "kjv.jsonl.zst"), "rb") as f:
        lines = [json.loads(x)["text"] for x in dctx.stream_reader(f).read().splitlines() if x.strip()]
    docs = [np.array(e.ids + [50256], dtype=np.uint16) for e in tok.encode_batch(lines)]
    total = sum(len(d) for d in docs)
    meta = TokenizerMeta(kind="hf", name="gpt2", vocab_size=50257, eos_id=50256)
    copies = -(-tokens // total)  # whole copies: at least `tokens`
    size = -(-copies * total * 2 // shards) + 2 * max(len(d) for d in docs)  # uint16 bytes: `shards` shards exactly
    with ShardWriter(out, tokenizer_meta=meta, shard_size=f"{size}B", compression="zstd") as w:
        for copy in range(copies):
            for i, d in enumerate(docs):
                w.write(d, id=f"{copy}-{i}")
    return out


class Moto:
    """moto's S3 server in a subprocess, with the bucket `bench`: each loader's dataset under its own prefix."""

    def __init__(self):
        self.port = _port()
        exe = os.path.join(os.path.dirname(sys.executable), "moto_server")
        self.proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(self.port)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        import boto3

        self.client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{self.port}", region_name="us-east-1")
        for _ in range(600):
            try:
                self.client.create_bucket(Bucket=BUCKET)
                break
            except Exception:
                time.sleep(0.05)

    def upload(self, folder: str, prefix: str) -> None:
        """Every file under `folder` to s3://bench/PREFIX/ (relative paths kept)."""
        for base, _, names in os.walk(folder):
            for name in names:
                path = os.path.join(base, name)
                self.client.upload_file(path, BUCKET, f"{prefix}/{os.path.relpath(path, folder)}")

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


class Proxy:
    """`bench_remote_proxy.py` in front of moto: (round trip ms, cap MB/s)."""

    def __init__(self, upstream: int, latency_ms: float, mbps: float, folder: str):
        self.port, self.stats_path = _port(), os.path.join(folder, f"proxy-{latency_ms}-{mbps}.json")
        self.proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "tools", "bench_remote_proxy.py"),
                                      "--to", f"127.0.0.1:{upstream}", "--port", str(self.port), "--mbps", str(mbps),
                                      "--latency-ms", str(latency_ms), "--stats", self.stats_path])
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.05)

    def stats(self) -> dict:
        time.sleep(0.5)  # its file is written every 0.2 s
        with open(self.stats_path) as f:
            return json.load(f)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)


ADAPTERS = {"dataflow": "remote_dataflow", "baseline": "remote_dataflow", "mosaic": "remote_mosaic",
            "litdata": "remote_litdata", "webdataset": "remote_webdataset"}
PEERS = ("mosaic", "litdata", "webdataset")


def _adapter_module(code: str):
    import importlib

    sys.path.insert(0, ROOT)
    return importlib.import_module(f"tools.peers.{ADAPTERS[code]}")


def child(spec: dict) -> dict:
    """One case, in this (fresh) process: `tools/peers/remote_case.py` over the code's adapter."""
    module = _adapter_module(spec["code"])
    from tools.peers.remote_case import run, warm

    return (warm if spec.get("warm") else run)(spec, module.Adapter(spec))


def write_samples(dataset: str, work: str) -> int:
    """Each shard's token stream as a uint16 file under work/tokens (what the peers' formats are written from)
    and the sorted hashes of every window (work/expected.npy); the number of windows."""
    import numpy as np

    sys.path.insert(0, ROOT)
    from dataflow.formats.manifest import read_manifest
    from dataflow.formats.reader import iter_documents
    from tools.peers.remote_samples import expected_hashes

    m = read_manifest(dataset)
    os.makedirs(os.path.join(work, "tokens"))
    for i, shard in enumerate(m.shards):
        with open(os.path.join(work, "tokens", f"{i:05d}.bin"), "wb") as f:
            for _, toks in iter_documents(dataset, m, shards=[shard]):
                f.write(toks.astype(np.uint16).tobytes())
    expected = expected_hashes(work)
    np.save(os.path.join(work, "expected.npy"), expected)
    return len(expected)


def convert(code: str, work: str, python: str) -> tuple[str, str]:
    """The peer's format written from the samples, in the peer's environment (before any clock): (folder,
    description)."""
    out = os.path.join(work, f"fmt-{code}")
    p = subprocess.run([python, os.path.abspath(__file__), "--convert", code, "--work", work, "--out", out],
                       capture_output=True, text=True, cwd=ROOT)
    if p.returncode != 0:
        raise RuntimeError(f"converting to {code} failed: {p.stderr.strip().splitlines()[-1:]}")
    return out, p.stdout.strip().splitlines()[-1]


def warm_up(spec: dict, python: str, log: str) -> None:
    """One batch of the loader straight from the server, untimed, in a process of its own: every measured case
    then finds the interpreter's bytecode compiled (under PYTHONPYCACHEPREFIX) and the libraries in the page
    cache, as an installed package would, whatever was imported first."""
    env = dict(os.environ, AWS_ENDPOINT_URL=spec["endpoint"])
    with open(log, "w") as err:
        p = subprocess.run([python, os.path.abspath(__file__), "--child", json.dumps(dict(spec, warm=True))],
                           stdout=subprocess.DEVNULL, stderr=err, cwd=ROOT, env=env)
    if p.returncode != 0:
        print(f"{spec['code']}: warm-up failed (exit {p.returncode}; log: {log})")


def run_case(spec: dict, proxy: Proxy, python: str, log: str) -> dict:
    """One case in a fresh process of `python`; the proxy's counts of its cold part and of its resume."""
    before = proxy.stats()
    env = dict(os.environ, AWS_ENDPOINT_URL=spec["endpoint"])  # any client without an endpoint stays local
    with open(log, "w") as err:
        p = subprocess.Popen([python, os.path.abspath(__file__), "--child", json.dumps(spec)], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=err, text=True, cwd=ROOT, env=env)
        marked, last = False, None
        for line in p.stdout:
            msg = _json_line(line)
            if msg and msg.get("mark") == "resume" and not marked:
                marked, mid = True, proxy.stats()
                p.stdin.write("\n")
                p.stdin.flush()
            elif msg and "first_s" in msg:
                last = msg
        p.wait()
    if last is None or p.returncode != 0:
        with open(log) as f:
            lines = [x.strip() for x in f.read().splitlines() if x.strip()]
        named = [x for x in lines if "Error" in x or "Exception" in x]  # the exception, not its debug dump
        return {"error": ((named or lines or [f"exit {p.returncode}"])[-1])[:160] + f" (log: {log})"}
    after = proxy.stats()
    last["fetched"] = mid["down"] - before["down"]
    last["fetched_resumed"] = after["down"] - mid["down"]
    last["gets"] = mid["requests"] - before["requests"]
    return last


def _json_line(line: str) -> dict | None:
    try:
        msg = json.loads(line)
    except ValueError:
        return None
    return msg if isinstance(msg, dict) else None


def raw_download(proxy: Proxy, names: list[str]) -> float:
    """Seconds for one client to GET every shard, one after another, through the proxy."""
    import boto3

    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{proxy.port}", region_name="us-east-1")
    t0 = time.perf_counter()
    for name in names:
        client.get_object(Bucket=BUCKET, Key=f"ds/{name}")["Body"].read()
    return time.perf_counter() - t0


def _parse() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--convert", help=argparse.SUPPRESS)
    ap.add_argument("--work", help=argparse.SUPPRESS)
    ap.add_argument("--out", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", default="32M", help="dataset size in tokens (K/M suffix)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--conditions", default="20:100,100:25", help="round trip ms : cap MB/s, comma-separated")
    ap.add_argument("--workers", default="0,2")
    ap.add_argument("--window", type=int, default=8, help="shuffle_window")
    ap.add_argument("--limit", default="none", help="cache_limit")
    ap.add_argument("--baseline-src", help="a checkout of another dataflow to measure the same cases on")
    ap.add_argument("--peers", default=",".join(PEERS), help=f"of {','.join(PEERS)}, comma-separated, or none")
    ap.add_argument("--peer-python", default=os.path.join(ROOT, ".bench-venv", "bin", "python"),
                    help="the interpreter with the peers installed (`make bench-setup` builds .bench-venv)")
    ap.add_argument("--quick", action="store_true",
                    help="a smoke run: 2M tokens, 20 ms / 100 MB/s, 0 workers, where not given")
    ap.add_argument("--json", help="write every case's figures to this file")
    ap.add_argument("--markdown", help="write the cases as one markdown table (ratios to the best) to this file")
    args = ap.parse_args()
    for name, quick in (("tokens", "2M"), ("conditions", "20:100"), ("workers", "0")):
        if args.quick and getattr(args, name) == ap.get_default(name):
            setattr(args, name, quick)
    args.peers = [] if args.peers == "none" else args.peers.split(",")
    unknown = [p for p in args.peers if p not in PEERS]
    if unknown:
        ap.error(f"unknown peer {unknown[0]}: the peers are {', '.join(PEERS)}")
    if args.peers and not (args.child or args.convert) and not os.path.exists(args.peer_python):
        ap.error(f"{args.peer_python} not found: `make bench-setup` builds it, or pass --peers none")
    return args


def main() -> None:
    args = _parse()
    if args.child:
        print(json.dumps(child(json.loads(args.child))), flush=True)
        return
    if args.convert:
        print(_adapter_module(args.convert).convert(args.work, args.out), flush=True)
        return
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_EC2_METADATA_DISABLED": "true"})
    tokens = int(float(args.tokens.rstrip("KMkm")) * {"k": 1e3, "m": 1e6}.get(args.tokens[-1].lower(), 1))
    work = tempfile.mkdtemp(prefix="bench-remote-")
    # the children cache bytecode in the run's own folder (an environment made without it recompiles every
    # library a loader imports at its first request, inside the clock); nothing is written to the venvs
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    os.environ["PYTHONPYCACHEPREFIX"] = os.path.join(work, "pycache")
    try:
        results = _bench(args, tokens, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.markdown:
        from tools.peers.remote_report import markdown

        with open(args.markdown, "w") as f:
            f.write(f"`python tools/bench_remote.py {' '.join(sys.argv[1:])}`\n\n{markdown(results)}\n")


def _folder_bytes(folder: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(folder) for f in fs)


def _bench(args: argparse.Namespace, tokens: int, work: str) -> list[dict]:
    sys.path.insert(0, ROOT)
    from dataflow.formats.manifest import read_manifest
    from tools.peers.remote_samples import SEQ

    print("$ python tools/bench_remote.py " + " ".join(sys.argv[1:]))
    ds = write_dataset(os.path.join(work, "ds"), tokens, args.shards)
    shards = read_manifest(ds).shards
    n_tokens, data_bytes = sum(s.tokens for s in shards), sum(s.bytes for s in shards)
    bpt = data_bytes / n_tokens
    samples = write_samples(ds, work)
    print(f"dataset: {len(shards)} shards, {n_tokens / 1e6:.1f}M tokens ({samples} samples of {SEQ + 1}), "
          f"{data_bytes / 1e6:.1f} MB zstd ({bpt:.3f} bytes/token), shuffle_window={args.window}, "
          f"cache_limit={args.limit}")
    moto = Moto()
    try:
        return _cases(args, moto, ds, shards, work)
    finally:
        moto.close()


def _spec(args: argparse.Namespace, code: str, src: str | None, endpoint: str, workers: int, shards: int,
          work: str) -> dict:
    """What a case's process is told: the loader, where to read it, how, and the dataset's window hashes."""
    return {"code": code, "endpoint": endpoint, "bucket": BUCKET, "workers": workers, "src": src,
            "window": args.window, "limit": args.limit, "shards": shards,
            "expected": os.path.join(work, "expected.npy"), "cache": os.path.join(work, f"cache-{code}-{workers}")}


def _cases(args: argparse.Namespace, moto: Moto, ds: str, shards: list, work: str) -> list[dict]:
    """The peers' formats converted and uploaded, then every case under every condition, its row printed."""
    from tools.peers.remote_report import HEADER, derive, ratios, row

    n_tokens, data_bytes = sum(s.tokens for s in shards), sum(s.bytes for s in shards)
    bpt = data_bytes / n_tokens
    moto.upload(ds, "ds")
    sizes = {"dataflow": data_bytes, "baseline": data_bytes}
    codes = [("dataflow", sys.executable, None)]
    codes += [("baseline", sys.executable, args.baseline_src)] if args.baseline_src else []
    for peer in args.peers:
        t0 = time.perf_counter()
        folder, what = convert(peer, work, args.peer_python)
        sizes[peer] = _folder_bytes(folder)
        moto.upload(folder, peer)
        print(f"{peer}: {what}; {sizes[peer] / 1e6:.1f} MB ({sizes[peer] / n_tokens:.3f} bytes/token), written in "
              f"{time.perf_counter() - t0:.1f} s (before the clock)")
        codes.append((peer, args.peer_python, None))
    for code, python, src in codes:
        warm_up(_spec(args, code, src, f"http://127.0.0.1:{moto.port}", 0, len(shards), work), python,
                os.path.join(work, f"{code}-warm.log"))
    results: list[dict] = []
    for cond in args.conditions.split(","):
        latency, mbps = (float(x) for x in cond.split(":"))
        proxy = Proxy(moto.port, latency, mbps, work)
        try:
            raw = raw_download(proxy, [s.path for s in shards])
            ceiling = mbps * 1e6 / bpt
            print(f"\n{latency:.0f} ms / {mbps:.0f} MB/s: ceiling {ceiling / 1e6:.1f}M tokens/s (dataflow's bytes "
                  f"per token; the ceiling column of every loader is against it); one client's GETs of every "
                  f"shard {raw:.2f} s ({data_bytes / raw / 1e6:.1f} MB/s); fetched: x the loader's own bytes")
            print(HEADER)
            for workers in (int(w) for w in args.workers.split(",")):
                by_code = {}
                for code, python, src in codes:
                    spec = _spec(args, code, src, f"http://127.0.0.1:{proxy.port}", workers, len(shards), work)
                    r = derive(run_case(spec, proxy, python, os.path.join(work, f"{code}.log")), sizes[code],
                               ceiling)
                    shutil.rmtree(spec["cache"], ignore_errors=True)
                    by_code[code] = r
                    results.append(dict(r, code=code, workers=workers, latency_ms=latency, mbps=mbps))
                    print(row(code, workers, r), flush=True)
                for line in ratios(workers, by_code):
                    print(line)
        finally:
            proxy.close()
    return results


if __name__ == "__main__":
    main()
