"""`make demo`: the whole path on built-in data, on CPU, in a minute or two.

raw text -> `dataflow tokenize` -> zstd Arrow shards -> StreamingDataset -> DevicePrefetcher ->
`python -m trainer` -> starvation summary. Everything is written under one output folder.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import random
import subprocess
import sys
import time

import zstandard

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

NAMES = ["Ada", "Bram", "Cleo", "Dov", "Eli", "Fern", "Gus", "Hana", "Ivo", "Juno", "Kai", "Lena"]
PLACES = ["the mill", "the harbour", "the old library", "the orchard", "the station", "the market", "the hill"]
THINGS = ["a lantern", "a map", "a red kite", "a brass key", "a loaf of bread", "a letter", "a small boat"]
FEELINGS = ["happy", "tired", "curious", "worried", "proud", "surprised", "calm"]
VERBS = ["found", "lost", "painted", "carried", "mended", "hid", "sold", "borrowed"]


def story(rng: random.Random, n: int) -> str:
    """A short templated story: structure a small model can learn in a few dozen steps."""
    a, b = rng.sample(NAMES, 2)
    place, thing = rng.choice(PLACES), rng.choice(THINGS)
    lines = [f"Story {n}: {a} and {b}.", f"One morning {a} walked to {place}."]
    for _ in range(rng.randint(3, 7)):
        who = rng.choice([a, b])
        lines.append(rng.choice([
            f"{who} {rng.choice(VERBS)} {thing} near {place}.",
            f"{who} felt {rng.choice(FEELINGS)}.",
            f"\"Where is {thing}?\" asked {who}.",
            f"{who} counted {rng.randint(2, 9)} boats and {rng.randint(2, 9)} birds.",
        ]))
    lines.append(f"In the evening {a} and {b} went home from {place}. The end.")
    return " ".join(lines)


def write_corpus(path: str, documents: int, seed: int = 0) -> None:
    rng = random.Random(seed)
    buf = io.StringIO()
    for n in range(documents):
        buf.write(json.dumps({"id": f"story-{n:05d}", "text": story(rng, n)}) + "\n")
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3).compress(buf.getvalue().encode()))


def run(title: str, cmd: list[str]) -> None:
    print(f"\n=== {title}\n$ {' '.join(cmd)}", flush=True)
    subprocess.run(cmd, check=True, cwd=ROOT)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", default="demo-out", help="everything is written under this folder")
    p.add_argument("--documents", type=int, default=4000)
    p.add_argument("--steps", type=int, default=None, help="override the demo config's train.steps")
    args = p.parse_args()
    out = os.path.abspath(args.out)
    started = time.perf_counter()
    corpus = os.path.join(out, "corpus", "stories.jsonl.zst")
    write_corpus(corpus, args.documents)
    print(f"built-in corpus: {args.documents} generated stories in {corpus}")
    data = os.path.join(out, "data")
    py = sys.executable
    run("tokenize (byte tokenizer, zstd Arrow shards, 2% validation split)",
        [py, "-m", "dataflow", "tokenize", corpus, "-o", data, "--shard-size", "256KB", "--val-fraction", "0.02",
         "--workers", "2", "--overwrite"])
    run("verify", [py, "-m", "dataflow", "verify", os.path.join(data, "train")])
    train = [py, "-m", "trainer", "--config", os.path.join(ROOT, "configs", "demo.toml"),
             "--set", f"data.path={os.path.join(data, 'train')}",
             "--set", f"data.val_path={os.path.join(data, 'val')}",
             "--set", f"checkpoint.dir={os.path.join(out, 'checkpoints')}",
             "--set", "checkpoint.resume=none", "--set", "checkpoint.replace=true",  # anew, over the last demo
             "--set", f"log.jsonl={os.path.join(out, 'metrics.jsonl')}"]
    if args.steps:
        train += ["--set", f"train.steps={args.steps}"]
    run("train a small GPT on CPU from the streaming loader through the prefetcher", train)
    print(f"\ndemo finished in {time.perf_counter() - started:.0f} s; everything is under {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
