"""Ours, through the public path: StreamingDataLoader(StreamingDataset(path, seq_len=2048), batch_size=8, ...)."""

from __future__ import annotations

from tools.peers.common import B, L, SEED, Ctx, dir_bytes

SETTINGS = ("zstd", "none", "tar")
NAMES = {"zstd": "zstd Arrow", "none": "uncompressed Arrow", "tar": ".tar.zst"}


def prepare(ctx: Ctx) -> None:  # written by bench_loader.py itself (ShardWriter)
    pass


def describe(setting: str, workers: int) -> str:
    return (f"{NAMES[setting]} shards of 64 MB; StreamingDataset(seq_len=2048, shuffle=True, seed=0) defaults "
            f"(shuffle_window=8 shards); StreamingDataLoader(batch_size=8, num_workers={workers}) defaults")


def disk_bytes(ctx: Ctx, setting: str) -> int:
    return dir_bytes(ctx.ours[setting])


def make(ctx: Ctx, setting: str, workers: int):
    from dataflow import StreamingDataLoader, StreamingDataset

    return StreamingDataLoader(StreamingDataset(ctx.ours[setting], seq_len=L, seed=SEED), batch_size=B,
                               num_workers=workers)


# ---- tokenize ------------------------------------------------------------------------------------------------------

def tokenize(work: str, workers: int, setting: str) -> dict:
    """`dataflow tokenize INPUT/*.jsonl -o OUT --tokenizer tokenizer.json --engine SETTING --workers N` (defaults
    otherwise: zstd Arrow, EOS appended), through the function the CLI calls."""
    import os
    import shutil
    import time

    from dataflow.formats.manifest import read_manifest
    from dataflow.formats.reader import iter_documents
    from dataflow.preprocess.run import TokenizeConfig, tokenize as run

    from tools.peers.common import gpt2_json, input_files

    out = os.path.join(work, f"out-dataflow-{setting}-{workers}")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    summary = run(TokenizeConfig(inputs=input_files(work), out=out, tokenizer=gpt2_json(), engine=setting,
                                 workers=workers, progress=False))
    seconds = time.perf_counter() - t0
    engine = getattr(summary, "engine", None) or (summary.get("engine") if isinstance(summary, dict) else None)
    m = read_manifest(out)
    eos = m.tokenizer.eos_id

    def docs():
        for _, toks in iter_documents(out, m):
            assert toks[-1] == eos
            yield toks[:-1]

    return {"seconds": seconds, "docs": docs, "engine": engine,
            "describe": f"dataflow tokenize --engine {setting} (ran: {engine}) --workers {workers}; zstd Arrow shards, "
                        f"EOS appended; default unit size"}
