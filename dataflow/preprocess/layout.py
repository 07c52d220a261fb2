"""Where one task of a `dataflow tokenize` run writes, and how its files get there: `OutputLayout`, the one interface
of the two kinds of output, a local folder (`FolderLayout`) and an object store (`StoreLayout`, any fsspec
URL; see output.py). `layout_of` picks one; nothing else in the run asks which kind it writes.

Both name the same places (split folders, a task's `part-*`, the error log, the work folder) and do the same
steps; they differ in how. A folder gets its shards by rename from the scratch folder and keeps its work (the
journal, the run lock) in `OUT/_work/`; an object store has no rename, no folder and no `flock`: its workers
upload their shards to final names, its work lies in a local folder under the cache, and what the end puts
beside the shards (the tokenizer's copy, the manifest, the error log) is written there first, then uploaded.
"""

from __future__ import annotations

import abc
import contextlib
import json
import os
import shutil
from typing import TYPE_CHECKING, Any

from dataflow.errors import DataflowError
from dataflow.formats import remote
from dataflow.formats.atomic import write_json_atomic
from dataflow.formats.manifest import MANIFEST_NAME, TOKENIZE_WORK_DIR as WORK_DIR
from dataflow.formats.remote_errors import explain
from dataflow.preprocess import output

if TYPE_CHECKING:
    from dataflow.preprocess.config import ResolvedConfig
    from dataflow.preprocess.journal import Progress

CLAIMS_NAME = "claims.json"  # an object store's claim: the bundles whose workers may have uploaded
EVERY = float("inf")


def layout_of(cfg: ResolvedConfig) -> OutputLayout:
    """The layout of this task's output: an object store for a URL, else a local folder."""
    return StoreLayout(cfg) if remote.is_remote(cfg.out) else FolderLayout(cfg)


class OutputLayout(abc.ABC):
    """Where one task of a run writes: split folders, its part of them, its work and error files; and how it
    puts its files there (see the module)."""

    def __init__(self, cfg: ResolvedConfig, work_root: str, errors_dir: str) -> None:
        self.out = cfg.out
        self.splits = cfg.splits
        self.tasked = cfg.tasked
        tag = f"{cfg.task_index:05d}"
        self.work_root = work_root  # every task's work (and run lock) of this output
        self.work = os.path.join(self.work_root, f"task-{tag}")
        self.errors_name = f"_errors-{tag}.jsonl" if self.tasked else "_errors.jsonl"
        self.errors_folder = cfg.out  # where the error log finally lies
        self.errors = os.path.join(errors_dir, self.errors_name)  # where the run writes it
        self.errors_url = output.join(cfg.out, self.errors_name)
        self.part = f"part-{tag}" if self.tasked else None
        # the tokenizer file copied beside each manifest (None: the built-in bytes tokenizer)
        self.tokenizer_source = None if cfg.tokenizer == "bytes" else cfg.tokenizer.removeprefix("tiktoken:")

    def split_dir(self, split: str) -> str:
        return self.out if self.splits == ("train",) else output.join(self.out, split)

    def writer_dir(self, split: str) -> str:
        return output.join(self.split_dir(split), self.part) if self.part else self.split_dir(split)

    def writer_dirs_either_layout(self) -> list[str]:
        """This task's folders with and without a val split (OUT, OUT/train, OUT/val, or its part of each): where
        an earlier run of other settings may have left a dataset."""
        dirs = [self.out, output.join(self.out, "train"), output.join(self.out, "val")]
        return [output.join(d, self.part) for d in dirs] if self.part else dirs

    def manifests_either_layout(self) -> list[str]:
        return [output.join(d, MANIFEST_NAME) for d in self.writer_dirs_either_layout()]

    def finished_manifest(self) -> str | None:
        """The train split's manifest, when one was written there (by a run of ours or not: see ownership.py)."""
        path = output.join(self.writer_dir("train"), MANIFEST_NAME)
        return path if self.exists(path) else None

    # --- the start -----------------------------------------------------------------------------------

    @abc.abstractmethod
    def exists(self, path: str) -> bool:
        """Whether `path` (in the output) is there."""

    def check_reachable(self) -> None:
        """Fail in one line, before anything starts, when the output cannot be written at all."""

    def explain(self, e: BaseException) -> DataflowError | None:
        """What the output's storage said in `e` (expired credentials, an endpoint gone), as one line; None when
        `e` is no storage error."""
        return None

    @abc.abstractmethod
    def folders_to_lock(self) -> tuple[str, ...]:
        """The folders the run lock needs, outermost first (made for the run, removed again if left empty)."""

    def task_parts(self) -> list[str]:
        """The `part-*` folders of task slices under OUT (or its split folders), as OUT-relative paths."""
        return []

    def work_in_output(self) -> str | None:
        """The work folder when it lies inside the output (`OUT/_work`, where a file of someone else's may be)."""
        return None

    # --- the shards ------------------------------------------------------------------------------------

    def upload_dirs(self) -> dict[str, str] | None:
        """Each split's folder, when the workers upload their shards there themselves (None: they do not)."""
        return None

    def rename_dirs(self) -> dict[str, str] | None:
        """Each split's folder, when the commit renames the workers' shards into it (None: it does not)."""
        return None

    def make_split_dirs(self) -> None:
        """The split folders, before the first commit."""

    @abc.abstractmethod
    def claimed_range(self, split: str, journaled: Progress | None, listed: int) -> tuple[int, float] | None:
        """The shard numbers [lo, hi) an interrupted run may have put in `split` that no journal lists
        (`listed`: how many it lists there); None when it claimed none (see ownership.py)."""

    def save_claims(self, units: tuple[int, int]) -> None:
        """Before the workers start: what they may put in place before a journal lists it (the bundles [lo, hi)
        they tokenize), where a rerun after a crash finds it."""

    def temp_folders(self) -> list[str]:
        """The folders where the run's atomic writes may have left temp files."""
        return []

    def remove_if_empty(self, folder: str) -> None:
        """Remove `folder` of the output if nothing is left in it (never OUT itself)."""

    # --- the end ---------------------------------------------------------------------------------------

    @abc.abstractmethod
    def staging_dir(self, split: str) -> str:
        """The local folder where the files put beside `split`'s shards (the tokenizer's copy, the manifest)
        are written; `publish` puts them in place."""

    def publish(self, split: str, name: str) -> None:
        """Put the file `name` written in `staging_dir(split)` in its place beside the split's shards."""

    def check_placed(self, split: str, listed: list[dict[str, Any]]) -> None:
        """Before the manifest names them: the shards of `split` the journal lists are the ones put there."""

    def publish_error_log(self) -> None:
        """The error log in its final place (`errors_url`)."""

    def restore_error_log(self) -> bool:
        """Fetch the error log back from its final place, for a resume whose local log is short; False when
        there is nothing to fetch."""
        return False

    def remove_work(self) -> None:
        """A finished run's work goes: a rerun finds the manifests and nothing to resume."""
        shutil.rmtree(self.work)


class FolderLayout(OutputLayout):
    """A local folder: shards renamed in by the commit, the work in OUT/_work, atomic writes in place."""

    def __init__(self, cfg: ResolvedConfig) -> None:
        super().__init__(cfg, os.path.join(cfg.out, WORK_DIR), cfg.out)

    def exists(self, path: str) -> bool:
        return os.path.exists(path)

    def folders_to_lock(self) -> tuple[str, ...]:
        return self.out, self.work_root

    def task_parts(self) -> list[str]:
        found = []
        for split in ("", "train", "val"):
            folder = os.path.join(self.out, split)
            if os.path.isdir(folder):
                found += sorted(os.path.join(split, n) for n in os.listdir(folder)
                                if n.startswith("part-") and os.path.isdir(os.path.join(folder, n)))
        return found

    def work_in_output(self) -> str | None:
        return self.work_root

    def rename_dirs(self) -> dict[str, str] | None:
        return {split: self.writer_dir(split) for split in self.splits}

    def make_split_dirs(self) -> None:
        for split in self.splits:
            os.makedirs(self.writer_dir(split), exist_ok=True)

    def claimed_range(self, split: str, journaled: Progress | None, listed: int) -> tuple[int, float] | None:
        # the journal claims a bound on the numbers before the commit renames shards in; the shards of a run
        # are numbered in order, so the unlisted ones follow the listed (a journal of before claims: all of them)
        if journaled is None:
            return None
        bound = journaled.claimed.get(split, 0) if journaled.claimed is not None else EVERY
        return listed, bound

    def temp_folders(self) -> list[str]:
        return [self.writer_dir(split) for split in self.splits]

    def remove_if_empty(self, folder: str) -> None:
        if os.path.normpath(folder) != os.path.normpath(self.out):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only if empty: a folder holding other files stays

    def staging_dir(self, split: str) -> str:
        return self.writer_dir(split)  # written in place, atomically

    def remove_work(self) -> None:
        super().remove_work()
        if not os.listdir(self.work_root):
            os.rmdir(self.work_root)


class StoreLayout(OutputLayout):
    """An object store: shards uploaded by the workers to final names, the work (journal, lock, error log) in a
    local folder under the cache, one per output URL (a rerun must start on the same machine to resume); what
    the end writes is staged in the work folder, then uploaded (the manifest last: the commit point)."""

    def __init__(self, cfg: ResolvedConfig) -> None:
        work_root = output.local_work_root(cfg.out)
        super().__init__(cfg, work_root, work_root)

    def exists(self, path: str) -> bool:
        return output.exists(path)

    def check_reachable(self) -> None:
        output.check_reachable(self.out)

    def explain(self, e: BaseException) -> DataflowError | None:
        return explain(self.out, e)

    def folders_to_lock(self) -> tuple[str, ...]:
        return (self.work_root,)

    def upload_dirs(self) -> dict[str, str] | None:
        return {split: self.writer_dir(split) for split in self.splits}

    def claimed_range(self, split: str, journaled: Progress | None, listed: int) -> tuple[int, float] | None:
        # shards are named by their bundle's first unit: the claims file's bundles, else (a journal of before
        # claims files) every one from the journal's next unit
        units = self._claimed_units()
        if units is None and journaled is None:
            return None
        return units or (journaled.next_unit, EVERY)

    def save_claims(self, units: tuple[int, int]) -> None:
        os.makedirs(self.work, exist_ok=True)
        write_json_atomic(os.path.join(self.work, CLAIMS_NAME), {"units": list(units)})

    def _claimed_units(self) -> tuple[int, int] | None:
        try:
            with open(os.path.join(self.work, CLAIMS_NAME)) as f:
                lo, hi = json.load(f)["units"]
            return int(lo), int(hi)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def staging_dir(self, split: str) -> str:
        return self.work

    def publish(self, split: str, name: str) -> None:
        output.put_file(os.path.join(self.work, name), output.join(self.writer_dir(split), name))

    def check_placed(self, split: str, listed: list[dict[str, Any]]) -> None:
        output.check_uploaded(self.writer_dir(split), listed)

    def publish_error_log(self) -> None:
        output.put_file(self.errors, self.errors_url)

    def restore_error_log(self) -> bool:
        if not output.exists(self.errors_url):
            return False
        output.get_file(self.errors_url, self.errors)
        return True

    def remove_work(self) -> None:
        super().remove_work()
        os.remove(self.errors)  # (only now: a resume needs the local log the journal counts)
