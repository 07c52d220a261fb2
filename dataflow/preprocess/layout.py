"""Where one task of a `dataflow tokenize` run writes: its split folders, its part of them, its work and error files."""

from __future__ import annotations

import os
import shutil
from typing import TYPE_CHECKING

from dataflow.formats import remote
from dataflow.formats.manifest import MANIFEST_NAME
from dataflow.preprocess import output

if TYPE_CHECKING:
    from dataflow.preprocess.run import TokenizeConfig

WORK_DIR = "_work"


class Layout:
    """Where one task of a run writes: split folders, its part of them, its work and error files."""

    def __init__(self, cfg: TokenizeConfig):
        self.out = cfg.out
        self.remote = remote.is_remote(cfg.out)  # an object store: see output.py
        self.splits = ["train"] if cfg.val_fraction <= 0 else ["train", "val"]
        self.tasked = cfg.num_tasks > 1
        tag = f"{cfg.task_index:05d}"
        self.work_root = output.local_work_root(cfg.out) if self.remote else os.path.join(cfg.out, WORK_DIR)
        self.work = os.path.join(self.work_root, f"task-{tag}")
        errors = f"_errors-{tag}.jsonl" if self.tasked else "_errors.jsonl"
        self.errors = os.path.join(self.work_root if self.remote else cfg.out, errors)  # written here, locally
        self.errors_url = output.join(cfg.out, errors)  # and finally there
        self.part = f"part-{tag}" if self.tasked else None

    def split_dir(self, split: str) -> str:
        return self.out if self.splits == ["train"] else output.join(self.out, split)

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
        path = output.join(self.writer_dir("train"), MANIFEST_NAME)
        return path if self.exists(path) else None

    def remove_partial_writes(self) -> None:
        """Temp files of atomic writes that a killed run left behind (they never became shards)."""
        if self.remote:
            return
        for split in self.splits:
            folder = self.writer_dir(split)
            if os.path.isdir(folder):
                for name in os.listdir(folder):
                    if name.startswith(".") and name.endswith(".tmp"):
                        os.remove(os.path.join(folder, name))

    def remove_unlisted_shards(self, listed: dict[str, set[str]]) -> None:
        """Shards an interrupted run put in place after its last journal save (its rerun writes them again)."""
        if self.remote:
            for split in self.splits:
                output.remove_shards(self.writer_dir(split), keep=listed.get(split, set()))
            return
        for split in self.splits:
            folder = self.writer_dir(split)
            if os.path.isdir(folder):
                for name in os.listdir(folder):
                    if name.startswith("shard-") and name not in listed.get(split, ()):
                        os.remove(os.path.join(folder, name))

    def clear(self) -> None:
        """Remove this task's earlier output (for --overwrite), in either layout: a run that adds or drops the val
        split leaves nothing of the other behind."""
        dataset_files = (MANIFEST_NAME, "tokenizer.json", "tokenizer.tiktoken")
        if self.remote:
            for folder in self.writer_dirs_either_layout():
                output.remove_shards(folder, also=dataset_files)
            shutil.rmtree(self.work, ignore_errors=True)
            if os.path.exists(self.errors):
                os.remove(self.errors)
            return
        for path in [self.work, self.errors] + [d for d in self.writer_dirs_either_layout() if d != self.out]:
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.isfile(path):
                os.remove(path)
        if not self.tasked and os.path.isdir(self.out):
            for name in os.listdir(self.out):
                if name.startswith("shard-") or name in dataset_files:
                    os.remove(os.path.join(self.out, name))
