"""Which files a tokenize reads, and what kind each one is: paths, globs, folders and URLs -> input files.

The kind of a file comes from its name (`input_kind`): JSONL, Parquet or text, each optionally compressed,
or the Arrow stream files of a `datasets` folder. A folder written by `datasets`' `save_to_disk` stands for
its Arrow files in stored order (its JSON metadata is not input); a folder walked for inputs may hold such
folders. A local walk follows links to folders. Whatever no reader reads is refused here, before any work
(`not_inputs.py`: a FIFO or device, a dataflow dataset or shard, an Arrow IPC file). A remote listing is a
first contact: retried on transient failures (`remote.with_retries`), then one line.
"""

from __future__ import annotations

import glob
import os
import posixpath
from typing import Callable

import fsspec

from dataflow.debug import cause
from dataflow.errors import ConfigError, DataflowError, InputError, InputNotFoundError, MissingDependencyError
from dataflow.formats import remote
from dataflow.formats.remote_errors import explain, first_line, missing_backend, read_failed
from dataflow.sources import datasets_folder, not_inputs
from dataflow.sources.kind import DATASETS, JSONL, PARQUET, TEXT

JSONL_SUFFIXES = (".jsonl", ".json", ".ndjson")
TEXT_SUFFIXES = (".txt",)
COMPRESSION_SUFFIXES = {".gz": "gzip", ".zst": "zstd", ".zstd": "zstd", ".bz2": "bz2", ".xz": "xz"}
INPUT_TYPES = (".jsonl/.json/.ndjson or .txt, optionally .gz/.zst/.bz2/.xz, .parquet, or a `datasets` folder "
               "(save_to_disk)")


def split_compression(url: str) -> tuple[str, str | None]:
    """('data.jsonl', 'zstd') for 'data.jsonl.zst'."""
    for suffix, codec in COMPRESSION_SUFFIXES.items():
        if url.endswith(suffix):
            return url[: -len(suffix)], codec
    return url, None


def input_kind(url: str) -> str:
    """The name of the file's input kind (`kind.py`), from its name: 'jsonl', 'parquet', 'text' or
    'datasets' (an Arrow stream, as in a `datasets` folder); an `InputNotFoundError` for any other name."""
    base, codec = split_compression(url.lower())
    if base.endswith(".arrow") and codec is None:
        return DATASETS
    if base.endswith(JSONL_SUFFIXES):
        return JSONL
    if base.endswith(".parquet"):
        return PARQUET
    if base.endswith(TEXT_SUFFIXES):
        return TEXT
    raise InputNotFoundError(f"{url}: unsupported input type; expected {INPUT_TYPES}")


def expand_inputs(inputs: list[str], leave_out: Callable[[str], bool] | None = None) -> list[str]:
    """Paths, globs, directories and URLs -> the input files: each input's sorted, a `datasets` folder's in
    its stored order (a file its state lists twice comes twice, as `datasets` reads it); a file two inputs
    name is read once. `leave_out(path)`: files that are not inputs whatever their name (a run's own output
    in a folder of inputs: `ownership.written_by_runs_into`), given a local path or a URL. Everything is
    checked before any work: see `not_inputs.py`."""
    files: list[str] = []
    seen: set[str] = set()
    for item in inputs:
        for key, group in _listed(item, leave_out):
            if key not in seen:  # a folder's files come as its state lists them; a file named twice once
                files += [f for f in group if len(group) > 1 or f not in seen]
                seen.update(group, [key])
    return files


def _listed(item: str, leave_out: Callable[[str], bool] | None) -> list[tuple[str, list[str]]]:
    """`_expand_one(item)`, a remote listing retried on transient failures (`remote.with_retries`); what
    still fails is one line."""
    try:
        if remote.is_remote(item):
            return remote.with_retries(item, lambda: _expand_one(item, leave_out))
        return _expand_one(item, leave_out)
    except ImportError as e:
        raise _missing(item, e) from None
    except DataflowError:
        raise
    except Exception as e:  # noqa: BLE001  (backends raise their own types: httpx's for hf://, aiohttp's, ...)
        known = explain(item, e)
        if known is None and remote.is_remote(item):
            known = read_failed(item, e)
        if known is None and not isinstance(e, (OSError, ValueError)):
            raise
        raise known or InputError(f"{item}: cannot list or open ({type(e).__name__}: {first_line(e)})") \
            from cause(e)


def _missing(item: str, e: ImportError) -> MissingDependencyError:
    """The package that reads `item`'s scheme is not installed: which one, and how to install it."""
    scheme = item.split("://", 1)[0].lower()
    if scheme == "hf":  # huggingface_hub's HfFileSystem; it reads HF_TOKEN itself
        return MissingDependencyError(f"{item}: reading hf:// URLs needs huggingface_hub, which is not installed; "
                                      f"run: pip install huggingface_hub")
    return missing_backend(item, e)


def _hub_hint(item: str) -> str:
    """The Hub answers "not found" for a private or gated dataset the token in use cannot read."""
    return ("; a private or gated Hub dataset reads as missing without a token that can read it: set HF_TOKEN"
            if item.lower().startswith("hf://") else "")


def _expand_one(item: str, leave_out: Callable[[str], bool] | None = None) -> list[tuple[str, list[str]]]:
    """The files of one input, as (what names them once: a file, or a `datasets` folder, its files)."""
    fs, _, paths = fsspec.get_fs_token_paths(item)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    local = protocol in ("file", "local")
    found: list[tuple[str, list[str]]] = []
    if glob.has_magic(item):
        found = [(f, [f]) for f in sorted(fs.glob(paths[0]) if len(paths) == 1 else paths)]
    else:
        for p in paths:
            if fs.isdir(p):
                found += _walk(fs, p, local)
            elif fs.exists(p) or (local and os.path.islink(p)):
                found.append((p, [p]))
            else:
                raise InputNotFoundError(f"{item}: no such file or directory; check the path{_hub_hint(item)}")
    listed = bool(found)
    if leave_out is not None:  # (it is given local paths and URLs)
        found = [(key, kept) for key, group in found
                 if (kept := [f for f in group if not leave_out(f if local else fs.unstrip_protocol(f))])]
    if not found and listed:
        raise InputNotFoundError(f"{item}: holds only what this run writes (its output: shards, index.json, the "
                                 f"tokenizer's copy, error logs, _work/), no input; name the files to tokenize")
    if not found:
        raise InputNotFoundError(f"{item}: matched no input files; check the path or pattern{_hub_hint(item)} "
                                 f"(inputs: {INPUT_TYPES})")
    for key, group in found:
        _check(fs, key, group, local)
    return [(key, group) if local else (fs.unstrip_protocol(key), [fs.unstrip_protocol(f) for f in group])
            for key, group in found]


def _check(fs: fsspec.AbstractFileSystem, key: str, group: list[str], local: bool) -> None:
    """Refuse what no reader reads (`not_inputs.py`): a local file that is not a regular one, a dataflow
    dataset, an Arrow IPC file named as input."""
    for f in group if local else ():
        not_inputs.check_regular(f)
    if len(group) == 1 and key == group[0]:  # a file named, globbed or walked (not a `datasets` folder's)
        if not_inputs.is_dataflow_manifest(fs, key):
            raise not_inputs.dataset_refused(posixpath.dirname(key))
        if input_kind(key) == DATASETS:
            not_inputs.check_arrow(fs, key)


def _walk(fs: fsspec.AbstractFileSystem, folder: str, local: bool) -> list[tuple[str, list[str]]]:
    """The inputs under a folder, sorted; each `datasets` folder in it gives its Arrow files in stored order
    where its first file sorts, a DatasetDict folder is refused. Other `.arrow` files are not inputs here
    (a dataset made by `dataflow tokenize` holds some)."""
    names = _local_files(folder) if local else sorted(fs.find(folder))
    held = {posixpath.dirname(f) for f in names if posixpath.basename(f) == datasets_folder.STATE}
    for f in names:
        if posixpath.basename(f) == datasets_folder.DICT:
            datasets_folder.refuse_dict(fs, posixpath.dirname(f))
    out: list[str] = []
    for f in names:
        home = posixpath.dirname(f)
        if home in held:
            if home not in out:
                out.append(home)  # a placeholder, replaced by the folder's files below
        elif _is_input(f) and input_kind(f) != DATASETS:
            out.append(f)
    return [(f, datasets_folder.data_files(fs, f)) if f in held else (f, [f]) for f in out]


def _local_files(folder: str) -> list[str]:
    """Every file under a local folder, sorted, through links to folders too (a corpus on a cluster is often
    linked in from elsewhere; fsspec's `find` does not follow them); a link to a folder it lies in is a
    loop, refused in one line."""
    files: list[str] = []
    todo = [(folder, frozenset([os.path.realpath(folder)]))]
    while todo:
        here, above = todo.pop()
        with os.scandir(here) as entries:
            for entry in entries:
                if not entry.is_dir():  # follows links: a link to a folder is walked, a dangling one is a file
                    files.append(entry.path)
                    continue
                real = os.path.realpath(entry.path)
                if real in above:
                    raise InputNotFoundError(f"{entry.path}: a link to {real}, a folder it lies in (a loop); "
                                             f"remove the link, or name the inputs without it")
                todo.append((entry.path, above | {real}))
    return sorted(files)


def _is_input(path: str) -> bool:
    try:
        input_kind(path)
        return not os.path.basename(path).startswith((".", "_"))
    except ConfigError:
        return False
