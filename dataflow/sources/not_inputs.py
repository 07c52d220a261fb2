"""Files among the inputs that no reader reads, each refused while the inputs are listed, named for what it is.

- A local path that is not a regular file once links are followed: a FIFO blocks a reader for ever, a link to
  /dev/zero never ends (a JSONL line without end, a text document that grows without bound). A link to a
  regular file is read as the file.
- A dataflow dataset (its `index.json`; beside it `tokenizer.json`, which a walk took for JSONL) and its
  shards hold token ids, not text: to tokenize its documents again, `dataflow decode` them first.
- An Arrow IPC file (the random-access format, `ARROW1` at both ends) is not the Arrow *stream* that a
  `datasets` folder holds, which is the only Arrow a reader takes.

Each refusal is an `InputNotFoundError`: one line, exit 2, before any work starts.
"""

from __future__ import annotations

import os
import re
import stat

import fsspec
import pyarrow as pa

from dataflow.errors import InputNotFoundError
from dataflow.formats.manifest import MANIFEST_NAME

ARROW_FILE_MAGIC = b"ARROW1"
HEAD_BYTES = 4096  # what is read of an index.json to tell a dataflow manifest
# how every dataflow manifest begins (`Manifest.to_dict`: the format version, then the tokenizer)
MANIFEST_HEAD = re.compile(rb'\s*\{\s*"version"\s*:\s*\d+\s*,\s*"tokenizer"\s*:\s*\{')
_KINDS = ((stat.S_ISFIFO, "a named pipe (FIFO)"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


def check_regular(path: str) -> None:
    """Refuse a local input that is not a regular file after following links (a link to one is fine)."""
    link = f" (a link to {os.readlink(path)})" if os.path.islink(path) else ""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        raise InputNotFoundError(f"{path}{link}: the link leads to a file that does not exist; fix or remove the "
                                 f"link") from None
    if stat.S_ISREG(mode) or stat.S_ISDIR(mode):  # a folder a glob matched: its name's kind says what is wrong
        return
    what = next((name for test, name in _KINDS if test(mode)), "not a file")
    raise InputNotFoundError(f"{path}{link}: not a regular file ({what}): reading it would block or never "
                             f"end; tokenize reads regular files (and links to them): copy the data into a file, "
                             f"or leave it out of the inputs")


def is_dataflow_manifest(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    """Whether `path` (an `index.json`) is a dataflow manifest, told by how every one begins."""
    if os.path.basename(path.rstrip("/")) != MANIFEST_NAME:
        return False
    with fs.open(path, "rb") as f:
        return bool(MANIFEST_HEAD.match(f.read(HEAD_BYTES)))


def dataset_refused(folder: str) -> InputNotFoundError:
    """The refusal of a dataflow dataset given as input (or met in a folder of inputs)."""
    return InputNotFoundError(f"{folder}: a dataflow dataset (its {MANIFEST_NAME} and shards hold token ids, not "
                              f"text), not an input; to tokenize its documents again, decode them to JSONL first: "
                              f"dataflow decode {folder} -o {_jsonl_name(folder)}, then tokenize that file")


def _jsonl_name(folder: str) -> str:
    return (folder.rstrip("/").rsplit("/", 1)[-1] or "dataset") + ".jsonl"


def check_arrow(fs: fsspec.AbstractFileSystem, path: str) -> None:
    """Refuse an `.arrow` input that is an Arrow IPC file rather than a stream: one of a dataflow dataset's
    shards (named by its dataset when its manifest lies beside it, else by what it holds), or another table."""
    with fs.open(path, "rb") as f:
        if f.read(len(ARROW_FILE_MAGIC)) != ARROW_FILE_MAGIC:
            return  # an Arrow stream (or not Arrow at all: the stream reader says so, naming the file)
    folder = path.rstrip("/").rsplit("/", 1)[0] if "/" in path else "."
    manifest = f"{folder}/{MANIFEST_NAME}"
    if fs.isfile(manifest) and is_dataflow_manifest(fs, manifest):
        raise InputNotFoundError(f"{path}: a shard of the dataflow dataset {folder} (token ids, not text), not an "
                                 f"input; to tokenize its documents again, decode the dataset to JSONL first: "
                                 f"dataflow decode {folder} -o {_jsonl_name(folder)}, then tokenize that file")
    if _holds_tokens(fs, path):
        raise InputNotFoundError(f"{path}: an Arrow file of token ids (a dataflow shard, without the {MANIFEST_NAME} "
                                 f"of its dataset beside it), not text; put it back in its dataset and run "
                                 f"dataflow decode DATASET -o docs.jsonl, then tokenize that file")
    raise InputNotFoundError(f"{path}: an Arrow IPC file, not the Arrow stream files of a Hugging Face `datasets` "
                             f"folder (the only .arrow files tokenize reads); write its table as Parquet (e.g. "
                             f"pyarrow.parquet.write_table(pyarrow.ipc.open_file(PATH).read_all(), 'data.parquet')) "
                             f"and tokenize that")


def _holds_tokens(fs: fsspec.AbstractFileSystem, path: str) -> bool:
    """A dataflow shard's schema: a `tokens` column of lists of integers."""
    try:
        with fs.open(path, "rb") as f:
            schema = pa.ipc.open_file(f).schema
    except (pa.ArrowException, OSError, ValueError):
        return False
    tokens = schema.field("tokens").type if "tokens" in schema.names else None
    return tokens is not None and pa.types.is_list(tokens) and pa.types.is_integer(tokens.value_type)
