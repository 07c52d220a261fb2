"""Where one task of a `dataflow tokenize` run writes: its split folders, its part of them, its work and error files."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from dataflow.formats import remote
from dataflow.formats.manifest import MANIFEST_NAME, TOKENIZE_WORK_DIR as WORK_DIR
from dataflow.preprocess import output

if TYPE_CHECKING:
    from dataflow.preprocess.config import ResolvedConfig


class Layout:
    """Where one task of a run writes: split folders, its part of them, its work and error files."""

    def __init__(self, cfg: ResolvedConfig):
        self.out = cfg.out
        self.remote = remote.is_remote(cfg.out)  # an object store: see output.py
        self.splits = cfg.splits
        self.tasked = cfg.tasked
        tag = f"{cfg.task_index:05d}"
        self.work_root = output.local_work_root(cfg.out) if self.remote else os.path.join(cfg.out, WORK_DIR)
        self.work = os.path.join(self.work_root, f"task-{tag}")
        self.errors_name = f"_errors-{tag}.jsonl" if self.tasked else "_errors.jsonl"
        self.errors_folder = cfg.out  # where the error log finally lies
        self.errors = os.path.join(self.work_root if self.remote else cfg.out, self.errors_name)  # written here
        self.errors_url = output.join(cfg.out, self.errors_name)
        self.part = f"part-{tag}" if self.tasked else None
        # the tokenizer file copied beside each manifest (None: the built-in bytes tokenizer)
        self.tokenizer_source = None if cfg.tokenizer == "bytes" else cfg.tokenizer.removeprefix("tiktoken:")

    def split_dir(self, split: str) -> str:
        return self.out if self.splits == ("train",) else output.join(self.out, split)

    def writer_dir(self, split: str) -> str:
        return output.join(self.split_dir(split), self.part) if self.part else self.split_dir(split)

    def exists(self, path: str) -> bool:
        return output.exists(path) if self.remote else os.path.exists(path)

    def writer_dirs_either_layout(self) -> list[str]:
        """This task's folders with and without a val split (OUT, OUT/train, OUT/val, or its part of each): where
        an earlier run of other settings may have left a dataset."""
        dirs = [self.out, output.join(self.out, "train"), output.join(self.out, "val")]
        return [output.join(d, self.part) for d in dirs] if self.part else dirs

    def task_parts(self) -> list[str]:
        """The `part-*` folders of task slices under OUT (or its split folders), as OUT-relative paths."""
        found = []
        for split in ("", "train", "val"):
            folder = os.path.join(self.out, split)
            if os.path.isdir(folder):
                found += sorted(os.path.join(split, n) for n in os.listdir(folder)
                                if n.startswith("part-") and os.path.isdir(os.path.join(folder, n)))
        return found

    def manifests_either_layout(self) -> list[str]:
        return [output.join(d, MANIFEST_NAME) for d in self.writer_dirs_either_layout()]

    def finished_manifest(self) -> str | None:
        """The train split's manifest, when one was written there (by a run of ours or not: see ownership.py)."""
        path = output.join(self.writer_dir("train"), MANIFEST_NAME)
        return path if self.exists(path) else None
