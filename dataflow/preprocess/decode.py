"""Documents back as text: a dataset's tokens through the tokenizer it was written with (its copy).

For a dataset at a URL the tokenizer's copy is fetched (retried as a dataset's first contact is, checked
against the manifest's sha256) into a temporary folder, loaded, and the folder removed; the shards come
through the `ShardFiles` the caller passes (see `formats/reader.py`).
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from typing import Any, Iterator

import fsspec
import numpy as np

from dataflow.debug import cause
from dataflow.errors import FormatError, StorageError
from dataflow.formats import remote
from dataflow.formats.manifest import Framing, Manifest, TokenizerMeta
from dataflow.formats.reader import ShardFiles, iter_documents
from dataflow.formats.remote_errors import explain, server_error
from dataflow.tokenizers.load import Tokenizer, tokenizer_for_dataset


def decode_documents(dataset: str, manifest: Manifest, files: ShardFiles | None = None,
                     storage_options: dict[str, Any] | None = None) -> Iterator[dict[str, str]]:
    """Every document as {"id", "text"}, in stored order; `files`: where the shards are read from (default:
    in place, for a local folder)."""
    tok = dataset_tokenizer(dataset, manifest.tokenizer, storage_options)
    framing = manifest.tokenizer.framing
    for doc_id, tokens in iter_documents(dataset, manifest, files=files):
        yield {"id": doc_id, "text": tok.decode(tokens) if framing is None else tok.decode_all(unframed(tokens, framing))}


def unframed(tokens: np.ndarray, framing: Framing) -> np.ndarray:
    """A stored document's ids without the BOS and EOS its framing put around its text: any other special
    token (a string parsed into its id, with --special-tokens parse) is text and stays. A manifest without a
    framing (before it was recorded) decodes with its EOS dropped wherever it is (`Tokenizer.decode`)."""
    lo = 1 if framing.bos_id is not None and len(tokens) and tokens[0] == framing.bos_id else 0
    hi = len(tokens) - 1 if framing.eos_id is not None and len(tokens) > lo and tokens[-1] == framing.eos_id \
        else len(tokens)
    return tokens[lo:hi]


def dataset_tokenizer(dataset: str, meta: TokenizerMeta, storage_options: dict[str, Any] | None = None) -> Tokenizer:
    """The tokenizer a dataset (a folder or a URL) was written with, from its copy beside the manifest."""
    if not remote.is_remote(dataset) or meta.kind == "bytes" or not meta.file:
        return tokenizer_for_dataset(dataset.removeprefix("file://"), meta)
    with tempfile.TemporaryDirectory(prefix="dataflow-tokenizer-") as tmp:
        local = os.path.join(tmp, *meta.file.split("/"))
        os.makedirs(os.path.dirname(local), exist_ok=True)
        with open(local, "wb") as f:
            f.write(_fetch(remote.shard_url(dataset, meta.file), meta, storage_options))
        return tokenizer_for_dataset(tmp, meta)  # loaded into memory: the copy may go


def _fetch(url: str, meta: TokenizerMeta, storage_options: dict[str, Any] | None) -> bytes:
    """The tokenizer file's bytes, checked against the manifest's sha256 (when it records one)."""

    def read() -> bytes:
        with fsspec.open(url, "rb", **remote.with_timeouts(url, storage_options)) as f:
            return f.read()

    try:
        data = remote.with_retries(url, read)
    except FileNotFoundError as e:
        answer = server_error(e)
        if answer is not None:
            raise StorageError(f"{url}: cannot read the tokenizer's copy ({remote.describe(answer)}); check the "
                               "server, then retry") from cause(e)
        raise FormatError(f"{url}: the tokenizer's copy that the manifest names is not there; re-upload it or "
                          "re-create the dataset") from None
    except Exception as e:
        raise (explain(url, e) or StorageError(f"{url}: cannot read the tokenizer's copy ({remote.describe(e)}); "
                                               "check the URL and the server, then retry")) from cause(e)
    if meta.sha256 is not None and hashlib.sha256(data).hexdigest() != meta.sha256:
        raise FormatError(f"{url}: the tokenizer's copy does not match the manifest's sha256; it was replaced or "
                          "damaged: re-upload it or re-create the dataset")
    return data

