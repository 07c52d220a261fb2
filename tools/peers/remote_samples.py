"""The samples of `tools/bench_remote.py`'s dataset, shared by every loader it measures: each shard's token stream
(uint16, one file a shard), its windows (seq_len + 1 tokens at stride seq_len, within one shard, as dataflow
serves them), a hash per window, and the check that a loader's epoch served those windows.

Every peer's format is written from these windows, so every loader serves the same samples; the check compares
multisets of window hashes (the dataset repeats one corpus, so a window can occur twice).
"""

from __future__ import annotations

import os

import numpy as np

SEQ, BATCH = 2048, 8
W = SEQ + 1
_K = np.random.default_rng(36).integers(1, 2**63, size=W, dtype=np.uint64) | np.uint64(1)


def shard_paths(work: str) -> list[str]:
    """The per-shard token files the parent wrote, in shard order."""
    d = os.path.join(work, "tokens")
    return [os.path.join(d, f) for f in sorted(os.listdir(d)) if f.endswith(".bin")]


def windows(path: str) -> np.ndarray:
    """A (n, W) read-only view of one shard's windows (no copy)."""
    data = np.memmap(path, dtype=np.uint16, mode="r")
    n = (len(data) - 1) // SEQ if len(data) > SEQ else 0
    return np.lib.stride_tricks.as_strided(data, shape=(n, W), strides=(SEQ * 2, 2), writeable=False)


def hash_rows(rows: np.ndarray) -> np.ndarray:
    """One uint64 per window: a weighted sum of its tokens (mod 2**64), mixed; equal windows hash equal."""
    rows = np.asarray(rows)
    if rows.ndim != 2 or rows.shape[1] != W:
        raise ValueError(f"a batch of windows of {W} tokens was expected, got shape {rows.shape}")
    h = ((rows.astype(np.uint64) + np.uint64(1)) * _K).sum(axis=1, dtype=np.uint64)
    h ^= h >> np.uint64(31)
    return h * np.uint64(0x9E3779B97F4A7C15)


def expected_hashes(work: str) -> np.ndarray:
    """Every window of the dataset, hashed, sorted."""
    parts = []
    for path in shard_paths(work):
        w = windows(path)
        parts += [hash_rows(w[i:i + 1024]) for i in range(0, len(w), 1024)]
    return np.sort(np.concatenate(parts)) if parts else np.zeros(0, np.uint64)


def multiset_diff(got: np.ndarray, want: np.ndarray) -> tuple[int, int]:
    """(samples in `got` beyond `want`, samples of `want` missing from `got`), counting repeats."""
    gu, gc = np.unique(got, return_counts=True)
    wu, wc = np.unique(want, return_counts=True)
    at = np.searchsorted(wu, gu)
    found = (at < len(wu)) & (wu[np.minimum(at, len(wu) - 1)] == gu)
    matched = np.zeros(len(wu), np.int64)
    matched[at[found]] = gc[found]
    extra = int(gc[~found].sum() + np.maximum(matched - wc, 0).sum())
    missing = int(np.maximum(wc - matched, 0).sum())
    return extra, missing


def verdict(served: np.ndarray, expected: np.ndarray, slack: int) -> str:
    """'ok' when the epoch served only the dataset's windows, none twice, and missed fewer than `slack` (the
    partial last batch of each worker); else what went wrong."""
    extra, missing = multiset_diff(served, expected)
    if extra == 0 and missing < slack:
        return "ok"
    return f"BAD(+{extra} -{missing})"


def resume_verdict(before: np.ndarray, after: np.ndarray, cold: np.ndarray) -> str:
    """'exact' when the samples served before the state plus those served after resuming are the cold epoch's."""
    extra, missing = multiset_diff(np.concatenate([before, after]), cold)
    return "exact" if extra == missing == 0 else f"+{extra} -{missing}"
