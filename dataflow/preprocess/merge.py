"""`dataflow merge OUT`: one manifest over the parts written by `--num-tasks K` task slices.

Each task writes `OUT/[split/]part-0000I/` with its own shards and manifest. Merging lists every part's
shards, in task order, under one `index.json` per split, without copying a byte of shard data. The
parts' unit ranges are contiguous in input order, so the merged dataset holds the same documents in
the same order as a single-machine run.

`OUT` is a local folder or any fsspec URL (`s3://`, `gs://`, ...). A part is finished when its manifest
is there (a task's commit point); merge refuses, in one line, parts that are unfinished or never started,
a part whose manifest is damaged, and parts made with other settings or another tokenizer. The merged
manifest is written last: atomically (temp file + rename) in a folder, by one PUT on an object store.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

import fsspec

from dataflow.debug import cause
from dataflow.errors import ConfigError, DataflowError, FormatError, StorageError
from dataflow.formats import remote
from dataflow.formats.manifest import MANIFEST_NAME, Manifest, ShardInfo, read_manifest, write_manifest
from dataflow.formats.remote_errors import explain, first_line
from dataflow.preprocess import output
from dataflow.preprocess.ownership import manifest_files

PART = re.compile(r"part-(\d{5})")


def merge(out: str) -> dict[str, Manifest]:
    """Write `index.json` for each split of a task-sliced run at `out`; returns the merged manifests."""
    out = out.removeprefix("file://")  # a local folder: its manifest is written atomically
    fs, root = _filesystem(out)
    splits = [s for s in ("train", "val") if _call(out, lambda s=s: fs.isdir(posixpath.join(root, s)))]
    merged = {}
    for split in splits or [None]:
        split_url = output.join(out, split) if split else out
        merged[split or "train"] = _merge_split(fs, posixpath.join(root, split) if split else root, split_url)
    return merged


def _merge_split(fs: Any, root: str, url: str) -> Manifest:
    """Merge the parts under one split (`root` on `fs`, `url` as the user wrote it) and commit the manifest."""
    manifests = _finished_parts(fs, root, url)
    first_part, first = manifests[0]
    _check_one_run(url, manifests)
    _check_tasks(url, manifests)
    for part, m in manifests:
        _check_shard_files(fs, posixpath.join(root, part), output.join(url, part), m)
    shards = [ShardInfo(f"{part}/{s.path}", s.documents, s.tokens, s.bytes, s.sha256)
              for part, m in manifests for s in m.shards]
    provenance = dict(first.provenance)
    provenance.pop("task", None)
    provenance["parts"] = [part for part, _ in manifests]
    manifest = Manifest(tokenizer=first.tokenizer, format=first.format, compression=first.compression,
                        dtype=first.dtype, shards=shards, provenance=provenance)
    earlier = _call(url, lambda: manifest_files(url)) or set()  # a single run's dataset that this one replaces
    if first.tokenizer.file:  # beside the manifest, where readers look for it; never a shard's bytes
        _copy_tokenizer(fs, root, url, first_part, first.tokenizer.file)
    if remote.is_remote(url):
        _call(url, lambda: output.write_remote_manifest(url, manifest))  # the commit point: one PUT
    else:
        write_manifest(url, manifest)
    for name in sorted(earlier - {MANIFEST_NAME, first.tokenizer.file}):  # its shards, listed by no manifest now
        _call(url, lambda name=name: output.remove(output.join(url, name)))
    return manifest


def _finished_parts(fs: Any, root: str, url: str) -> list[tuple[str, Manifest]]:
    """(part, manifest) of every task, in task order; refuses parts unfinished, never started or damaged, and
    parts beyond the run's number of tasks (left by an earlier run of more)."""
    names = sorted(posixpath.basename(p.rstrip("/")) for p in _list(fs, root, url))
    parts = [n for n in names if PART.fullmatch(n)]
    if not parts:
        raise ConfigError(f"{url}: no part-* folders to merge; was it written with --num-tasks?")
    manifests, unfinished = [], []
    for part in parts:
        if _call(url, lambda p=part: fs.exists(posixpath.join(root, p, MANIFEST_NAME))):
            manifests.append((part, _read_part(url, part)))
        else:
            unfinished.append(part)
    if manifests:
        expected = _num_tasks(manifests[0][1], len(parts))
        beyond = [p for p in parts if _task_of(p) >= expected]
        if beyond:
            raise DataflowError(f"{output.join(url, beyond[0])}: no task of this {expected}-task run (left by a run "
                                "of more tasks?); remove it, then merge again")
        unfinished += [f"part-{i:05d}" for i in range(expected) if f"part-{i:05d}" not in parts]
    if unfinished or not manifests:
        raise DataflowError(f"{url}: tasks not finished: {', '.join(sorted(unfinished))}; rerun those task "
                            "indices, then merge again")
    return manifests


def _check_one_run(url: str, manifests: list[tuple[str, Manifest]]) -> None:
    """Refuse parts made with other output settings or another tokenizer than the first, naming what differs."""
    first_part, first = manifests[0]
    settings = first.provenance.get("settings") or {}
    for part, m in manifests[1:]:
        theirs = m.provenance.get("settings") or {}
        changed = sorted(k for k in set(settings) | set(theirs) if settings.get(k) != theirs.get(k))
        if changed:
            what = "; ".join(f"{k}: {_short(theirs.get(k))} there, {_short(settings.get(k))} in {first_part}"
                             for k in changed[:3])
            raise DataflowError(f"{output.join(url, part)} was made with other settings than {first_part} ({what}); "
                                "rerun it with the same command as the other tasks (add --overwrite), then merge again")
        if m.tokenizer != first.tokenizer:
            raise DataflowError(f"{output.join(url, part)} was made with another tokenizer file than {first_part}; "
                                "rerun it with the same tokenizer (add --overwrite), then merge again")


def _short(value: Any) -> str:
    text = json.dumps(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _check_tasks(url: str, manifests: list[tuple[str, Manifest]]) -> None:
    """Each part holds its own task's slice (its provenance names the task of its folder, of this run's K), and
    their bundle ranges split the whole plan as `--num-tasks K` does: contiguous, from bundle 0 to the last."""
    k = len(manifests)  # every task 0..K-1 has its folder, each once (see _finished_parts)
    ranges = []
    for part, m in manifests:
        i, task = _task_of(part), m.provenance.get("task")
        rerun = f"rerun task {i} (--task-index {i} --overwrite), then merge again"
        if not isinstance(task, dict):
            raise DataflowError(f"{output.join(url, part)}: its manifest names no task (it was not written by "
                                f"`dataflow tokenize --num-tasks`); {rerun}")
        bundles = task.get("bundles")
        if (task.get("index"), task.get("of")) != (i, k):
            raise DataflowError(f"{output.join(url, part)} holds the slice of task {task.get('index')!r} of "
                                f"{task.get('of')!r}, not task {i} of {k} (a part copied or moved?); {rerun}")
        if not (isinstance(bundles, list) and len(bundles) == 2 and all(type(b) is int for b in bundles)):
            raise DataflowError(f"{output.join(url, part)}: its manifest's bundle range {bundles!r} is not two "
                                f"integers; {rerun}")
        begins = ranges[-1][1] if ranges else 0
        if bundles[0] != begins or bundles[1] < bundles[0]:
            where = f"part-{i - 1:05d}'s ends at bundle {begins}" if i else "the first slice begins at bundle 0"
            raise DataflowError(f"{output.join(url, part)} holds bundles [{bundles[0]}, {bundles[1]}) of the input, "
                                f"but {where} (the slices must follow each other); {rerun}")
        ranges.append(tuple(bundles))
    total = ranges[-1][1]
    split = [(i * total // k, (i + 1) * total // k) for i in range(k)]
    if ranges != split:
        raise DataflowError(f"{url}: the parts' bundle ranges {_ranges(ranges)} do not split the plan's {total} "
                            f"bundles as --num-tasks {k} does ({_ranges(split)}); the part manifests were edited: "
                            "rerun the tasks with --overwrite, then merge again")


def _ranges(ranges: list[tuple[int, int]]) -> str:
    return ", ".join(f"part-{i:05d} [{lo}, {hi})" for i, (lo, hi) in enumerate(ranges))


def _check_shard_files(fs: Any, folder: str, url: str, m: Manifest) -> None:
    """Every shard the part's manifest lists is in its folder with the size listed (one listing of the folder;
    the sha256 is `dataflow verify`'s: it reads every byte, and merge reads none)."""
    listing = {posixpath.basename(e["name"].rstrip("/")): e for e in _call(url, lambda: fs.ls(folder, detail=True))}
    task = _task_of(posixpath.basename(folder))
    for shard in m.shards:
        path = posixpath.normpath(shard.path)
        entry = listing.get(path) if "/" not in path else _info(fs, posixpath.join(folder, path), url)
        size = None if entry is None or entry.get("type") == "directory" else entry.get("size")
        if size != shard.bytes:
            what = "missing" if size is None else f"{size:,} bytes, its manifest says {shard.bytes:,}"
            raise FormatError(f"{output.join(url, shard.path)}: {what}; the part is damaged: rerun task {task} "
                              f"(--task-index {task} --overwrite), then merge again")


def _info(fs: Any, path: str, url: str) -> dict[str, Any] | None:
    try:
        return _call(url, lambda: fs.info(path))
    except FileNotFoundError:
        return None


def _task_of(part: str) -> int:
    """The task index a `part-0000I` folder is named for."""
    return int(part.split("-")[1])


def _num_tasks(m: Manifest, default: int) -> int:
    """The number of tasks of the run that wrote `m` (its settings), else `default`."""
    k = (m.provenance.get("settings") or {}).get("num_tasks")
    return k if type(k) is int and k >= 1 else default


def _copy_tokenizer(fs: Any, root: str, url: str, part: str, name: str) -> None:
    try:
        _call(url, lambda: fs.copy(posixpath.join(root, part, name), posixpath.join(root, name)))
    except FileNotFoundError:
        raise FormatError(f"{output.join(output.join(url, part), name)}: the tokenizer's copy that the part's manifest "
                          f"names is missing; rerun task {_task_of(part)} with --overwrite, then merge "
                          "again") from None


def _read_part(url: str, part: str) -> Manifest:
    try:
        return read_manifest(output.join(url, part))
    except FormatError as e:
        task = _task_of(part)
        raise FormatError(f"{output.join(url, part)} cannot be merged, its manifest is damaged ({e}); rerun task "
                          f"{task} (--task-index {task} --overwrite), then merge again") from None


def _filesystem(out: str) -> tuple[Any, str]:
    """The filesystem of `out` and its path there, with fresh listings (another machine's tasks wrote it)."""
    try:
        fs, root = fsspec.core.url_to_fs(out, **remote.with_timeouts(out, None))
    except (ImportError, ValueError, TypeError) as e:
        raise (explain(out, e) or ConfigError(f"{out}: cannot open this URL ({first_line(e)}); fix it")) from cause(e)
    fs.invalidate_cache()
    return fs, root.rstrip("/") or root


def _list(fs: Any, root: str, url: str) -> list[str]:
    try:
        return _call(url, lambda: fs.ls(root, detail=False))
    except (FileNotFoundError, NotADirectoryError):
        raise ConfigError(f"{url}: no such folder; pass the -o of the `dataflow tokenize --num-tasks` runs") from None


def _call(url: str, do: Any) -> Any:
    """`do()`, with what a store raises for common mistakes (credentials, network, a server's error) as one line;
    "not found" is left to the caller, who knows what was looked for."""
    try:
        return do()
    except (DataflowError, FileNotFoundError, NotADirectoryError):
        raise
    except Exception as e:
        raise (explain(url, e) or StorageError(f"{url}: {remote.describe(e)}; check the URL, the credentials and "
                                               "the server, then merge again")) from cause(e)
