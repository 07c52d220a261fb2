"""LitData: `optimize(..., item_loader=TokensLoader())` then `StreamingDataset(item_loader=TokensLoader(block_size=2049),
shuffle=True)` and LitData's `StreamingDataLoader` (LitGPT's pretraining recipe)."""

from __future__ import annotations

import functools
import os
import shutil

import numpy as np

from tools.peers.common import B, W, SEED, Ctx, dir_bytes, done, mark_done

SETTINGS = ("tokens",)
SLICE = 1 << 20  # tokens per optimize() input


def _slice(bounds, bin_path):
    import torch

    data = np.memmap(bin_path, dtype=np.uint16, mode="r")
    yield torch.from_numpy(np.array(data[bounds[0]:bounds[1]]))  # stored as uint16


def prepare(ctx: Ctx) -> None:
    out = ctx.path("litdata")
    if done(out):
        return
    shutil.rmtree(out, ignore_errors=True)
    from litdata import TokensLoader, optimize

    n = os.path.getsize(ctx.bin) // 2
    inputs = [(s, min(s + SLICE, n)) for s in range(0, n, SLICE)]
    optimize(fn=functools.partial(_slice, bin_path=ctx.bin), inputs=inputs, output_dir=out,
             chunk_size=W * 4096, item_loader=TokensLoader(), num_workers=2, reorder_files=False, verbose=False)
    mark_done(out)


def describe(setting: str, workers: int) -> str:
    return (f"optimize(TokensLoader(), chunk_size=2049*4096 tokens, uint16); StreamingDataset(TokensLoader(block_size=2049), "
            f"shuffle=True, seed=0), int64 per sample; StreamingDataLoader(batch_size=8, num_workers={workers})")


def disk_bytes(ctx: Ctx, setting: str) -> int:
    return dir_bytes(ctx.path("litdata"))


def make(ctx: Ctx, setting: str, workers: int):
    from litdata import StreamingDataLoader, StreamingDataset, TokensLoader

    class Int64Tokens(StreamingDataset):
        def __getitem__(self, index):
            return super().__getitem__(index).long()

    ds = Int64Tokens(ctx.path("litdata"), item_loader=TokensLoader(block_size=W), shuffle=True, seed=SEED)
    return StreamingDataLoader(ds, batch_size=B, num_workers=workers)


# ---- tokenize ------------------------------------------------------------------------------------------------------

_TOK = None


def _tokenize_file(path: str):
    """LitGPT's recipe: one JSONL file in, one tensor of ids (EOS appended) per document out."""
    import json

    import torch
    from tokenizers import Tokenizer

    from tools.peers.common import EOS_TEXT, gpt2_json

    global _TOK
    if _TOK is None:
        _TOK = Tokenizer.from_file(gpt2_json())
        _TOK.encode_special_tokens = True
    eos = _TOK.token_to_id(EOS_TEXT)
    with open(path, "rb") as f:
        for line in f:
            ids = _TOK.encode(json.loads(line)["text"], add_special_tokens=False).ids
            ids.append(eos)
            yield torch.tensor(ids, dtype=torch.int32)


def tokenize(work: str, workers: int, setting: str) -> dict:
    import json
    import os
    import time

    from litdata import TokensLoader, optimize

    from tools.peers.common import input_files, split_eos

    out = os.path.join(work, f"out-litdata-{workers}")
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    optimize(fn=_tokenize_file, inputs=input_files(work), output_dir=out, chunk_bytes="64MB",
             item_loader=TokensLoader(), num_workers=workers, verbose=False)
    seconds = time.perf_counter() - t0

    def docs():
        with open(os.path.join(out, "index.json")) as f:
            index = json.load(f)
        dtype = {"15": np.int32, "16": np.int32, "17": np.int64, "20": np.uint16}[index["config"]["data_format"][0].split(":")[1]]
        for chunk in index["chunks"]:
            raw = np.fromfile(os.path.join(out, chunk["filename"]), dtype=np.uint8)
            n = int(raw[:4].view(np.uint32)[0])
            offsets = raw[4:4 + 4 * (n + 1)].view(np.uint32)
            yield from split_eos(raw[offsets[0]:offsets[-1]].view(dtype), 50256)

    return {"seconds": seconds, "docs": docs,
            "describe": f"optimize(fn=per-file generator: tokenizers Tokenizer.encode per document + EOS, int32 tensors), "
                        f"TokensLoader(), chunk_bytes=64MB, num_workers={workers}"}
