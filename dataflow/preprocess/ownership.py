"""Which files in a tokenize output are the run's own: the names it writes, and the ones it may remove.

A run writes names of its own kinds only (`NAMES`: shards, `index.json`, the tokenizer's copy, the error
log, `_work/`), and removes only what a journal or a manifest of its own lists:
- a resume removes the shards its interrupted run *claimed* in the journal before putting them in place
  (`Progress.claimed`, a bound on the numbers of the shards a local run renames in; on an object store the
  bundles whose workers may have uploaded, `claims.json` beside the journal) but never listed as committed;
- `--overwrite` removes the dataset a manifest of ours lists (its shards, the manifest, the tokenizer's
  copy, the error log) and the journal's shards, nothing else.
Any other file under one of those names was not written by this run: the run refuses to start (exit 2)
naming it, and never deletes it. Other files beside a dataset (its inputs, notes, other data) are left alone.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable

from dataflow.errors import ConfigError, DataflowError
from dataflow.formats import remote
from dataflow.formats.manifest import MANIFEST_NAME, TOKENIZE_WORK_DIR as WORK_DIR, read_manifest
from dataflow.preprocess import output
from dataflow.preprocess.journal import Progress, load_progress

if TYPE_CHECKING:
    from dataflow.preprocess.layout import OutputLayout

# shard-00012.arrow (a local run, numbered in input order), shard-00000012-000000-00000.tar.zst (an object
# store: named by bundle, `output.final_name`), in every shard format
SHARD_NAME = re.compile(r"shard-(\d+)(?:-\d+)*\.(?:arrow|tar|tar\.zst)$")
TOKENIZER_NAMES = ("tokenizer.json", "tokenizer.tiktoken")
ERRORS_NAME = re.compile(r"_errors(?:-\d+)?\.jsonl$")
TEMP_NAME = re.compile(r"\.(?:index\.json|_errors(?:-\d+)?\.jsonl)\..+\.tmp$")  # our atomic writes' temp files
TASK_WORK = re.compile(r"task-\d+(?:\.lock)?$")  # what runs keep in OUT/_work
SPLIT_DIRS = ("train", "val")
PART_DIR = re.compile(r"part-\d+$")  # a task's slice of a --num-tasks run


def is_reserved(name: str) -> bool:
    """Whether a run of ours may write a file of this name into a dataset folder."""
    return bool(SHARD_NAME.match(name)) or name == MANIFEST_NAME or name in TOKENIZER_NAMES


def is_run_output(name: str) -> bool:
    """Whether a run of ours (or `merge`) writes files of this name into a dataset folder: the reserved names,
    the error logs and the temp files of its atomic writes."""
    return is_reserved(name) or bool(ERRORS_NAME.match(name) or TEMP_NAME.match(name))


def written_by_runs_into(out: str) -> Callable[[str], bool]:
    """`expand_inputs`' `leave_out` for a run into `out`: whether a listed input file is one that a tokenize run
    (or merge) into `out` writes, whoever wrote it: under the run's names (`is_run_output`) in OUT, in its split
    folders (`train/`, `val/`) and their task parts (`part-NNNNN/`), or anything under OUT/_work/. A run
    whose output folder is (or lies in) a folder of its inputs so never reads its own output as input; a file
    under those names that no run of ours wrote is refused before any work (`refuse_foreign`). Other files in
    those folders stay inputs."""
    where, out_remote = _place(out), remote.is_remote(out)
    folders: dict[str, tuple[str, ...]] = {}  # each input folder's place, found once

    def leave_out(path: str) -> bool:
        if remote.is_remote(path) != out_remote:
            return False
        parent, _, name = path.rstrip("/").rpartition("/")
        parent = parent or ("/" if path.startswith("/") else ".")
        if parent not in folders:
            folders[parent] = _place(parent)
        parts = (*folders[parent], name)
        if len(parts) <= len(where) or parts[:len(where)] != where:
            return False
        rel = parts[len(where):]
        if rel[0] == WORK_DIR:
            return True
        if len(rel) > 1 and rel[0] in SPLIT_DIRS:
            rel = rel[1:]
        if len(rel) > 1 and PART_DIR.match(rel[0]):
            rel = rel[1:]
        return len(rel) == 1 and is_run_output(rel[0])

    return leave_out


def _place(url: str) -> tuple[str, ...]:
    """A folder or file as comparable parts: a local one by its real path (links followed), a URL by its
    location (`output.location_key`: backend, endpoint, path however spelled)."""
    if not remote.is_remote(url):
        return tuple(p for p in os.path.realpath(url.removeprefix("file://")).split(os.sep) if p)
    protocol, endpoint, path = json.loads(output.location_key(url))
    return (protocol, endpoint, *(p for p in path.split("/") if p))


@dataclass
class Owned:
    """The names in each folder that the run may replace or remove (and the folders it may remove once empty)."""

    names: dict[str, set[str]] = field(default_factory=dict)

    def add(self, folder: str, names: Iterable[str]) -> None:
        self.names.setdefault(folder, set()).update(names)

    def holds(self, folder: str, name: str) -> bool:
        return name in self.names.get(folder, ())


def owned(layout: OutputLayout, journaled: Progress | None) -> Owned:
    """What this task's earlier work wrote, by what its manifests (in either layout), its journal and its
    claims list: the files `--overwrite` may remove."""
    mine = Owned()
    for folder in layout.writer_dirs_either_layout():
        listed = manifest_files(folder)
        if listed is not None:
            mine.add(folder, listed)
            mine.add(layout.errors_folder, [layout.errors_name])
    if journaled is not None:
        for split, shards in journaled.shards.items():
            mine.add(layout.writer_dir(split), [s["path"] for s in shards])
        for split in layout.splits:  # the journal is saved before the tokenizer's copy and the error log
            mine.add(layout.writer_dir(split), (MANIFEST_NAME, *TOKENIZER_NAMES))
        mine.add(layout.errors_folder, [layout.errors_name])
    for folder, names in claimed(layout, journaled).items():
        mine.add(folder, names)
    return mine


def claimed(layout: OutputLayout, journaled: Progress | None) -> dict[str, set[str]]:
    """The shards an interrupted run claimed in its journal (or claims file) but did not list as committed:
    put in place after its last journal save, or uploaded by a worker before their bundle's commit."""
    found: dict[str, set[str]] = {}
    listed = {split: {s["path"] for s in shards} for split, shards in (journaled.shards if journaled else {}).items()}
    for split in layout.splits:
        folder = layout.writer_dir(split)
        done = listed.get(split, set())
        span = layout.claimed_range(split, journaled, len(done))  # each kind of output claims its own way
        names = [] if span is None else [n for n in list_names(folder)
                                         if (k := _shard_number(n)) is not None and span[0] <= k < span[1]]
        found[folder] = {n for n in names if n not in done}
    return found


def refuse_foreign(layout: OutputLayout, mine: Owned) -> None:
    """A `ConfigError` naming the files in the names this run writes that it did not write (and that no
    manifest or journal of ours lists): the run would replace or remove them."""
    foreign = []
    for split in layout.splits:
        folder = layout.writer_dir(split)
        foreign += [output.join(folder, n) for n in sorted(list_names(folder))
                    if is_reserved(n) and not mine.holds(folder, n) and not _same_tokenizer(layout, folder, n)]
    if output.exists_any(output.join(layout.errors_folder, layout.errors_name)) and \
            not mine.holds(layout.errors_folder, layout.errors_name):
        foreign.append(output.join(layout.errors_folder, layout.errors_name))
    if layout.work_in_output() is not None:
        foreign += _foreign_work(layout.work_in_output())
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise ConfigError(f"{shown}: a file this run would write is already there and was not written by a "
                          f"dataflow run into {layout.out} (no manifest or journal there lists it); move it away, "
                          f"or write the dataset elsewhere with another -o (--overwrite never removes it)")


def _foreign_work(work: str) -> list[str]:
    """OUT/_work when it is not a folder of our task work."""
    if os.path.isdir(work):
        return [os.path.join(work, n) for n in sorted(os.listdir(work)) if not TASK_WORK.match(n)][:1]
    return [work] if os.path.lexists(work) else []


def _same_tokenizer(layout: OutputLayout, folder: str, name: str) -> bool:
    """A tokenizer file that is the very file the run copies there (e.g. `--tokenizer OUT/tokenizer.json`)."""
    if name not in TOKENIZER_NAMES or layout.tokenizer_source is None:
        return False
    import fsspec

    try:
        with fsspec.open(layout.tokenizer_source, "rb") as a, fsspec.open(output.join(folder, name), "rb") as b:
            return a.read() == b.read()
    except (OSError, ValueError):
        return False


def remove_leftovers(layout: OutputLayout, journaled: Progress | None) -> None:
    """What an interrupted run left that no journal lists as committed: the shards it claimed, the temp
    files of its atomic writes. Call it before any worker starts: on an object store workers upload straight
    to final names, so a removal after they started would delete the new run's own shards."""
    for folder, names in claimed(layout, journaled).items():
        for name in names:
            output.remove(output.join(folder, name))
    for folder in layout.temp_folders():
        for name in list_names(folder):
            if TEMP_NAME.match(name):
                output.remove(os.path.join(folder, name))


def remove_owned(layout: OutputLayout, mine: Owned) -> None:
    """For --overwrite: every file of ours (see `owned`), then the folders of ours left empty."""
    for folder, names in mine.names.items():
        for name in names:
            output.remove(output.join(folder, name))
    for folder in mine.names:
        layout.remove_if_empty(folder)


def list_names(folder: str) -> list[str]:
    """The names in a local folder or under a URL prefix (none when it does not exist)."""
    try:
        return output.list_names(folder)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        raise ConfigError(f"{folder}: is a file where the dataset's folder goes; choose another -o") from None


def replace_earlier(layouts: list[OutputLayout]) -> None:
    """--overwrite: the earlier dataset and work of these tasks' layouts (this task's; for a single run, also
    those of the task slices it replaces) go, in either layout; refused first, with nothing removed, when a file
    under one of the names a run writes is not ours."""
    found = []
    for layout in layouts:
        try:
            journaled = load_progress(layout.work)
        except ConfigError:  # damaged: the run was ours, its shards are those of its numbering
            journaled = Progress(settings={})
        mine = owned(layout, journaled)
        refuse_foreign(layout, mine)
        found.append((layout, mine))
    for layout, mine in found:
        remove_owned(layout, mine)
        shutil.rmtree(layout.work, ignore_errors=True)
        output.remove(layout.errors)  # the log of an unfinished run (an object store's is local; a folder's, ours)


def forget_fresh_start(layout: OutputLayout) -> None:
    """A fresh run stopped before its first commit leaves nothing: what its workers uploaded (claimed), then
    its work folder. When the store cannot be reached now, the claims stay for the next run to act on."""
    try:
        remove_leftovers(layout, None)
    except Exception:  # noqa: BLE001  (each backend raises its own types)
        return
    shutil.rmtree(layout.work, ignore_errors=True)


def manifest_of_ours(folder: str) -> bool:
    return manifest_files(folder) is not None


def manifest_files(folder: str) -> set[str] | None:
    """The files a manifest of ours in `folder` lists (itself, its shards directly in the folder, the
    tokenizer's copy); None when there is no manifest, or `index.json` there is not one of ours."""
    path = output.join(folder, MANIFEST_NAME)
    if not output.exists_any(path):
        return None
    try:
        manifest = read_manifest(path)
    except DataflowError:
        return None  # not ours: refuse_foreign names it
    names = {MANIFEST_NAME} | {s.path for s in manifest.shards if "/" not in s.path}
    if manifest.tokenizer.file:
        names.add(manifest.tokenizer.file)
    return names


def _shard_number(name: str) -> int | None:
    m = SHARD_NAME.match(name)
    return int(m.group(1)) if m else None
