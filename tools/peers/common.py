"""What every loader adapter shares: the batch shape, the windows, and small helpers."""

from __future__ import annotations

import os
import sys
import types

import numpy as np

B, L = 8, 2048          # batch of 8 windows of L + 1 tokens (seq_len 2048)
W = L + 1
SEED = 0


class Ctx:
    """Paths of one benchmark run: `work` folder, the flat uint16 token file and our datasets."""

    def __init__(self, work: str):
        self.work = work
        self.bin = os.path.join(work, "tokens.bin")
        self.ours = {k: os.path.join(work, f"dataflow-{k}") for k in ("zstd", "none", "tar")}

    def path(self, name: str) -> str:
        return os.path.join(self.work, name)


def n_windows(bin_path: str) -> int:
    """Non-overlapping windows of W tokens, stride L (each token a label once), as ours serves them."""
    n = os.path.getsize(bin_path) // 2
    return (n - 1) // L


def windows(bin_path: str):
    """(index, uint16 window of W tokens) for every window of the flat token file, in order."""
    data = np.memmap(bin_path, dtype=np.uint16, mode="r")
    for i in range(n_windows(bin_path)):
        yield i, np.array(data[i * L:i * L + W])


def dir_bytes(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def done(path: str) -> bool:
    return os.path.exists(os.path.join(path, ".bench-done"))


def mark_done(path: str) -> None:
    with open(os.path.join(path, ".bench-done"), "w") as f:
        f.write("ok\n")


def stub_modules(names: dict[str, dict]) -> None:
    """Install empty modules (with the given attributes) in sys.modules: for unused imports only."""
    for name, attrs in names.items():
        mod = types.ModuleType(name)
        mod.__path__ = []  # a package, so that submodules can be stubbed too
        mod.__dict__.update(attrs)
        sys.modules[name] = mod


# ---- tokenize benchmark -------------------------------------------------------------------------------------------

def gpt2_json() -> str:
    """GPT-2's tokenizer.json: the one the benchmark set in BENCH_GPT2_JSON, else the repository's copy."""
    if os.environ.get("BENCH_GPT2_JSON"):
        return os.environ["BENCH_GPT2_JSON"]
    from tools import repo_data

    return str(repo_data.gpt2_json())


EOS_TEXT = "<|endoftext|>"


def input_files(work: str) -> list[str]:
    d = os.path.join(work, "input")
    return sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".jsonl"))


def split_eos(stream: np.ndarray, eos: int):
    """The documents of a flat token stream in which each document ends with EOS (EOS removed)."""
    ends = np.flatnonzero(stream == eos)
    start = 0
    for e in ends:
        yield stream[start:e]
        start = e + 1
    if start != len(stream):
        raise ValueError(f"{len(stream) - start} tokens after the last EOS")
