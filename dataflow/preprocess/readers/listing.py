"""Which files a tokenize reads, and what kind each one is: paths, globs, folders and URLs -> input files.

The kind of a file comes from its name (`input_kind`): JSONL, Parquet or text, each optionally compressed,
or the Arrow stream files of a `datasets` folder. A folder written by `datasets`' `save_to_disk` stands for
its Arrow files in stored order (its JSON metadata is not input); a folder walked for inputs may hold such
folders.
"""

from __future__ import annotations

import glob
import os
import posixpath

import fsspec

from dataflow.errors import ConfigError, InputError, InputNotFoundError, MissingDependencyError
from dataflow.formats.remote_errors import explain, missing_backend
from dataflow.preprocess.readers import datasets_folder

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
    """'jsonl', 'parquet', 'text' or 'arrow' (an Arrow stream, as in a `datasets` folder), from the file's
    name; an `InputNotFoundError` for any other name."""
    base, codec = split_compression(url.lower())
    if base.endswith(".arrow") and codec is None:
        return "arrow"
    if base.endswith(JSONL_SUFFIXES):
        return "jsonl"
    if base.endswith(".parquet"):
        return "parquet"
    if base.endswith(TEXT_SUFFIXES):
        return "text"
    raise InputNotFoundError(f"{url}: unsupported input type; expected {INPUT_TYPES}")


def expand_inputs(inputs: list[str]) -> list[str]:
    """Paths, globs, directories and URLs -> a sorted, de-duplicated list of input files."""
    files: list[str] = []
    for item in inputs:
        try:
            files += _expand_one(item)
        except ImportError as e:
            raise _missing(item, e) from None
        except Exception as e:  # noqa: BLE001  (backends raise their own types: httpx's for hf://, ...)
            known = explain(item, e)
            if known is None and not isinstance(e, (OSError, ValueError)):
                raise
            raise known or InputError(f"{item}: cannot list or open ({type(e).__name__}: {_first_line(e)})") \
                from None
    return list(dict.fromkeys(files))


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


def _first_line(e: BaseException) -> str:
    return next((line.strip() for line in str(e).splitlines() if line.strip()), type(e).__name__)


def _expand_one(item: str) -> list[str]:
    fs, _, paths = fsspec.get_fs_token_paths(item)
    protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
    found: list[str] = []
    if glob.has_magic(item):
        found = sorted(fs.glob(paths[0]) if len(paths) == 1 else paths)
    else:
        for p in paths:
            if fs.isdir(p):
                found += _walk(fs, p)
            elif fs.exists(p):
                found.append(p)
            else:
                raise InputNotFoundError(f"{item}: no such file or directory; check the path{_hub_hint(item)}")
    if not found:
        raise InputNotFoundError(f"{item}: matched no input files; check the path or pattern{_hub_hint(item)} "
                                 f"(inputs: {INPUT_TYPES})")
    return [f if protocol in ("file", "local") else fs.unstrip_protocol(f) for f in found]


def _walk(fs: fsspec.AbstractFileSystem, folder: str) -> list[str]:
    """The inputs under a folder, sorted; each `datasets` folder in it gives its Arrow files in stored order
    where its first file sorts, a DatasetDict folder is refused. Other `.arrow` files are not inputs here
    (a dataset made by `dataflow tokenize` holds some)."""
    names = sorted(fs.find(folder))
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
        elif _is_input(f) and input_kind(f) != "arrow":
            out.append(f)
    return [x for f in out for x in (datasets_folder.data_files(fs, f) if f in held else [f])]


def _is_input(path: str) -> bool:
    try:
        input_kind(path)
        return not os.path.basename(path).startswith((".", "_"))
    except ConfigError:
        return False
