"""datatrove: JsonlReader + DocumentTokenizer (tokenizers `encode_batch`, EOS appended, no document shuffling) on a
LocalPipelineExecutor with one task per input file and `workers` processes."""

from __future__ import annotations

import os
import shutil
import time

import numpy as np

from tools.peers.common import EOS_TEXT, gpt2_json, input_files, split_eos


def tokenize(work: str, workers: int, setting: str) -> dict:
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.tokens import DocumentTokenizer

    out = os.path.join(work, f"out-datatrove-{workers}")
    logs = os.path.join(work, f"logs-datatrove-{workers}")
    shutil.rmtree(out, ignore_errors=True)
    shutil.rmtree(logs, ignore_errors=True)
    files = input_files(work)
    t0 = time.perf_counter()
    LocalPipelineExecutor(
        pipeline=[JsonlReader(os.path.dirname(files[0]), glob_pattern="*.jsonl", text_key="text", id_key="id"),
                  DocumentTokenizer(out, tokenizer_name_or_path=gpt2_json(), eos_token=EOS_TEXT,
                                    shuffle_documents=False)],
        tasks=len(files), workers=workers, logging_dir=logs, skip_completed=False).run()
    seconds = time.perf_counter() - t0

    def docs():
        for name in sorted(os.listdir(out)):
            if name.endswith(".ds"):
                yield from split_eos(np.fromfile(os.path.join(out, name), dtype=np.uint16), 50256)

    return {"seconds": seconds, "docs": docs,
            "describe": f"JsonlReader + DocumentTokenizer(eos_token, shuffle_documents=False, batch_size=10000: "
                        f"tokenizers encode_batch), LocalPipelineExecutor(tasks={len(files)}, workers={workers})"}
