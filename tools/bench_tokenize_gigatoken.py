"""Raw gigatoken, the ceiling for `dataflow tokenize` on it: `encode_batch(parallel=False)` on texts already parsed.

Mirrors the raw engines of tools/peers/raw_tokenizers_peer.py: the texts are parsed before the clock
starts and shared with `workers` forked processes, each encodes 1/workers of them in calls of CHUNK
documents on its own thread; nothing is read or written while timed. Two figures per run:
  fresh   the process has encoded nothing before (the first call's set-up and a cold cache included)
  steady  the same texts again in the same process (its piece cache warm: the best case)
Writes the harness's result JSON (and the sorted per-document id hashes next to it), so that
tools/bench_tokenize.py compares its ids with `tokenizers` like any other case.

    python tools/bench_tokenize_gigatoken.py --work DIR --workers N --out RESULT.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tools.peers.procs import run_forked  # noqa: E402

CHUNK = 64  # documents per call, as the raw peers


def _texts(work: str) -> list[str]:
    d = os.path.join(work, "input")
    texts = []
    for name in sorted(f for f in os.listdir(d) if f.endswith(".jsonl")):
        with open(os.path.join(d, name), "rb") as f:
            texts += [json.loads(line)["text"] for line in f]
    return texts


def _worker(path: str, texts: list[str], barrier, out) -> None:
    import gigatoken

    tok = gigatoken.Tokenizer(path)
    barrier.wait()
    laps = []
    for _ in range(2):  # fresh, then steady
        t0 = time.perf_counter()
        ids = [tok.encode_batch(texts[i:i + CHUNK], parallel=False) for i in range(0, len(texts), CHUNK)]
        laps.append((t0, time.perf_counter()))
    hashes = [hashlib.sha1(np.asarray(d, dtype=np.uint32).tobytes()).hexdigest()[:16] for batch in ids for d in batch]
    out.put((laps, sum(len(d) for batch in ids for d in batch), hashes))


def measure(work: str, workers: int, tokenizer: str) -> dict:
    """Both laps' seconds (first start to last end over the workers), tokens, and the id hashes."""
    n = max(workers, 1)
    parts = run_forked(_worker, tokenizer, _texts(work), n)
    lap = lambda k: max(p[0][k][1] for p in parts) - min(p[0][k][0] for p in parts)  # noqa: E731
    hashes = sorted(h for p in parts for h in p[2])
    return {"seconds": lap(0), "steady_seconds": lap(1), "tokens": sum(p[1] for p in parts), "docs": len(hashes),
            "digest": hashlib.sha256("".join(hashes).encode()).hexdigest(), "hashes": hashes,
            "describe": f"gigatoken encode_batch(parallel=False), {CHUNK} documents a call, in {n} forked "
                        f"process(es) that each encode 1/{n} of the texts, parsed before the clock starts; fresh "
                        f"process (steady state: the same texts again)"}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--work", required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--out", required=True)
    p.add_argument("--tokenizer", default=os.environ.get("BENCH_GPT2_JSON"))
    args = p.parse_args()
    r = measure(args.work, args.workers, args.tokenizer)
    with open(args.out + ".hashes.json", "w") as f:
        json.dump(r.pop("hashes"), f)
    with open(args.out, "w") as f:
        json.dump(r, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
