"""The loader never imports pandas (1-2 s, in each process's first batch) even where it is installed: pyarrow
imports it on the first `Array.to_numpy`, so record batches are viewed from their buffers (`formats/arrow.py`).

A `sitecustomize` on the child's path records every process that imports pandas; the run reads zstd and plain
Arrow shards of real text (KJV, byte tokens), decoded once per machine and in the process, with two workers."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from support.no_pandas import HOOK

pytest.importorskip("pandas")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = '''
import sys
import numpy as np, zstandard
from dataflow import ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta
kjv, out, cache = sys.argv[1:4]
with open(kjv, "rb") as f:
    lines = zstandard.ZstdDecompressor().stream_reader(f).read(400_000).splitlines()[:-1]
meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
for compression in ("zstd", "none"):
    with ShardWriter(f"{out}/{compression}", tokenizer_meta=meta, shard_size="64KB", compression=compression) as w:
        for i, line in enumerate(lines):
            w.write(np.frombuffer(line, np.uint8).astype(np.uint16), id=f"kjv{i}")
    for once, workers in ((True, 2), (False, 0)):
        ds = StreamingDataset(f"{out}/{compression}", seq_len=127, cache_dir=cache, decode_once=once, position_ids=True)
        assert sum(1 for _ in StreamingDataLoader(ds, batch_size=8, num_workers=workers)) > 10
'''


def test_reading_batches_never_imports_pandas(kjv, tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text(HOOK)
    watch = tmp_path / "watch"
    watch.mkdir()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(hooks), ROOT]), PANDAS_WATCH=str(watch))
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(kjv), str(tmp_path / "ds"), str(tmp_path / "c")],
                       env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert os.listdir(watch) == []  # no process imported pandas
