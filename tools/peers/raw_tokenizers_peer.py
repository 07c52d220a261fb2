"""The raw engines: `tokenizers`' `encode_batch` and tiktoken's `encode_ordinary_batch` on texts already parsed,
one engine thread per process, `workers` forked processes, warm. No reading, parsing or writing: the ceiling."""

from __future__ import annotations

import json
import time

import numpy as np

from tools.peers.common import EOS_TEXT, gpt2_json, input_files
from tools.peers.procs import run_forked

CHUNK = 64  # documents per call


def _tiktoken():
    import tiktoken
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext.openai_public import r50k_pat_str

    import os
    bpe = os.path.join(os.path.dirname(gpt2_json()), "gpt2.tiktoken")
    enc = tiktoken.Encoding("gpt2-local", pat_str=r50k_pat_str, mergeable_ranks=load_tiktoken_bpe(bpe),
                            special_tokens={EOS_TEXT: 50256})
    return lambda texts: enc.encode_ordinary_batch(texts, num_threads=1)


def _tokenizers():
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(gpt2_json())
    tok.encode_special_tokens = True  # special-token strings in a document are text, as in ours
    return lambda texts: [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]


def _worker(kind: str, texts: list[str], barrier, out) -> None:
    """Encode this worker's share of the texts; report (start, end, tokens, doc hashes)."""
    import hashlib

    engine = _tiktoken() if kind == "tiktoken" else _tokenizers()
    engine(texts[:CHUNK])  # warm: engine loaded, caches primed
    barrier.wait()
    t0 = time.perf_counter()
    tokens = 0
    for i in range(0, len(texts), CHUNK):
        tokens += sum(len(ids) for ids in engine(texts[i:i + CHUNK]))
    t1 = time.perf_counter()
    # the check, untimed: the same engine again, ids kept
    hashes = [hashlib.sha1(np.asarray(ids, dtype=np.uint32).tobytes()).hexdigest()[:16]
              for i in range(0, len(texts), CHUNK) for ids in engine(texts[i:i + CHUNK])]
    out.put((t0, t1, tokens, hashes))


def tokenize(work: str, workers: int, setting: str) -> dict:
    import hashlib

    texts = []
    for path in input_files(work):
        with open(path, "rb") as f:
            texts += [json.loads(line)["text"] for line in f]
    n = max(workers, 1)
    parts = run_forked(_worker, setting, texts, n)  # the texts are shared with the workers, not sent
    hashes = sorted(h for part in parts for h in part[3])
    return {"seconds": max(p[1] for p in parts) - min(p[0] for p in parts), "tokens": sum(p[2] for p in parts),
            "docs": len(hashes), "digest": hashlib.sha256("".join(hashes).encode()).hexdigest(), "hashes": hashes,
            "describe": f"{'tiktoken encode_ordinary_batch' if setting == 'tiktoken' else 'tokenizers encode_batch'}, "
                        f"{CHUNK} documents a call, 1 thread, in {n} forked process(es) that each encode 1/{n} of "
                        f"the texts, parsed before the clock starts; nothing read or written while timed"}
