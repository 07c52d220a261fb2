"""What every conversion shares: the tokenizer behind --tokenizer, atomic outputs, our datasets in batches."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from dataflow.errors import ConfigError, FormatError
from dataflow.formats import remote
from dataflow.formats.manifest import MANIFEST_NAME, Manifest, TokenizerMeta, read_manifest
from dataflow.formats.reader import iter_documents

BATCH_TOKENS = 1 << 22  # tokens handed to a writer at a time


def tokenizer_meta(spec: str, folder: str) -> TokenizerMeta:
    """The manifest's tokenizer for `--tokenizer SPEC`, exactly as `dataflow tokenize` makes it (its file
    copied into `folder`). Nothing is encoded, so a tokenizer.json loads on `tokenizers` without proofs."""
    from dataflow.preprocess.tokenizers import load_tokenizer

    engine = "hf" if spec != "bytes" and not spec.startswith("tiktoken:") else "auto"
    return load_tokenizer(spec, engine).copy_into(folder)


def check_ids(tokens: np.ndarray, offsets: np.ndarray, vocab_size: int, where: str, first: int) -> None:
    """Token ids must lie in [0, vocab_size): a negative one is damage, one past the vocabulary is data made
    with another tokenizer. Names the document (`where:index`) holding the first offender."""
    if not tokens.size:
        return
    low, high = tokens.min(), tokens.max()
    if low >= 0 and high < vocab_size:
        return
    pos = int(np.argmax(tokens < 0)) if low < 0 else int(np.argmax(tokens >= vocab_size))
    doc = first + int(np.searchsorted(offsets, pos, side="right")) - 1
    if low < 0:
        raise FormatError(f"{where}:{doc}: token id {int(tokens[pos])} is negative: the data is damaged")
    raise ConfigError(f"{where}:{doc}: token id {int(tokens[pos])} is not below the vocabulary size {vocab_size} of "
                      f"--tokenizer: the data was made with another tokenizer; pass that one")


def refuse_existing(paths: list[str], overwrite: bool) -> None:
    """An output that exists is replaced only with --overwrite (an empty folder does not count)."""
    for p in paths:
        if os.path.exists(p) and not (os.path.isdir(p) and not os.listdir(p)) and not overwrite:
            raise ConfigError(f"{p} exists; pass --overwrite to replace it, or write elsewhere")


def refuse_overlap(inputs: list[str], outputs: list[str]) -> None:
    """No output may be an input, lie inside an input folder, or hold an input (replacing it would destroy
    what is being read, --overwrite or not)."""
    for out in outputs:
        o = os.path.realpath(out)
        for src in inputs:
            i = os.path.realpath(src)
            if os.path.commonpath([i, o]) in (i, o):
                raise ConfigError(f"-o {out}: is, holds or lies inside the input {src}; write elsewhere")


@contextlib.contextmanager
def dataset_output(out: str, overwrite: bool) -> Iterator[str]:
    """A temp folder beside `out` to write the dataset into; renamed over `out` when the `with` body succeeds,
    removed when it fails: `out` holds the old dataset or the whole new one, never part of one."""
    refuse_existing([out], overwrite)
    if os.path.isdir(out) and os.listdir(out) and not os.path.exists(os.path.join(out, MANIFEST_NAME)):
        raise ConfigError(f"-o {out}: a folder that holds no dataset; --overwrite replaces a dataset, not other "
                          f"files: pass a new or empty folder")
    parent = os.path.dirname(os.path.abspath(out))
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="." + os.path.basename(os.path.abspath(out)) + ".", suffix=".tmp", dir=parent)
    try:
        yield tmp
        os.chmod(tmp, 0o755)  # mkdtemp makes 0700; a dataset is meant to be shared
        old = None
        if os.path.isdir(out) and os.listdir(out):
            old = tempfile.mkdtemp(prefix="." + os.path.basename(os.path.abspath(out)) + ".", suffix=".old",
                                   dir=parent)
            os.replace(out, os.path.join(old, "dataset"))
        elif os.path.isdir(out):
            os.rmdir(out)  # empty
        elif os.path.exists(out):
            os.remove(out)  # a file, replaced with --overwrite
        os.replace(tmp, out)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


@dataclass
class Datasets:
    """Our datasets read back for --to: their common tokenizer, totals, and whether documents end with EOS
    (True/False as `tokenize --no-eos` recorded it, None when the manifest does not say)."""

    paths: list[str]
    manifests: list[Manifest]
    tokenizer: TokenizerMeta
    eos: bool | None

    @property
    def documents(self) -> int:
        return sum(m.documents for m in self.manifests)

    @property
    def tokens(self) -> int:
        return sum(m.tokens for m in self.manifests)


def open_datasets(paths: list[str]) -> Datasets:
    """Read the manifests of local datasets (folders or their index.json) that share one tokenizer."""
    folders, manifests = [], []
    for p in paths:
        if remote.is_remote(p):
            raise ConfigError(f"{p}: convert --to reads local datasets; download it first (e.g. with the "
                              f"fsspec/cloud CLI), then convert the local copy")
        p = p[len("file://"):] if p.startswith("file://") else p
        folders.append(os.path.dirname(p) if p.endswith(".json") else p)
        manifests.append(read_manifest(p))
    first = manifests[0].tokenizer
    for p, m in zip(paths, manifests):
        t = m.tokenizer
        if (t.kind, t.vocab_size, t.eos_id, t.sha256) != (first.kind, first.vocab_size, first.eos_id, first.sha256):
            raise ConfigError(f"{p}: tokenizer {t.name} (vocabulary {t.vocab_size}, EOS {t.eos_id}) differs from "
                              f"{paths[0]}'s {first.name} ({first.vocab_size}, {first.eos_id}); convert them "
                              f"separately")
    flags = {_eos_setting(m) for m in manifests}
    if len(flags) > 1:  # --eos-id would double the EOS of some documents; without it others run together
        said = {True: "with EOS after each document", False: "with --no-eos", None: "without saying which"}
        kinds = "; ".join(f"{p}: {said[_eos_setting(m)]}" for p, m in zip(paths, manifests))
        raise ConfigError(f"the datasets were tokenized differently ({kinds}); convert them separately")
    return Datasets(folders, manifests, first, flags.pop())


def _eos_setting(m: Manifest) -> bool | None:
    """Whether `dataflow tokenize` appended EOS to each document (its `eos` setting); None: not recorded."""
    settings = m.provenance.get("settings")
    eos = settings.get("eos") if isinstance(settings, dict) else None
    return eos if isinstance(eos, bool) else None


def dataset_batches(ds: Datasets) -> Iterator[tuple[int, np.ndarray, np.ndarray, list[str]]]:
    """(first document, tokens, offsets from 0, ids) of all documents of `ds` in stored order, about
    BATCH_TOKENS tokens at a time; checks the counts against the manifests."""
    first = 0
    for folder, manifest in zip(ds.paths, ds.manifests):
        docs, ids, size, seen = [], [], 0, 0
        for doc_id, tokens in iter_documents(folder, manifest):
            docs.append(tokens)
            ids.append(doc_id)
            size += len(tokens)
            if size >= BATCH_TOKENS:
                yield first, *_joined(docs, manifest.dtype), ids
                first, seen, docs, ids, size = first + len(ids), seen + len(ids), [], [], 0
        if docs:
            yield first, *_joined(docs, manifest.dtype), ids
            first, seen = first + len(ids), seen + len(ids)
        if seen != manifest.documents:
            raise FormatError(f"{os.path.join(folder, MANIFEST_NAME)}: its shards hold {seen} documents, the "
                              f"manifest counts {manifest.documents}; run `dataflow verify {folder}`")


def _joined(docs: list[np.ndarray], dtype: str) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs], dtype=np.int64)])
    return (np.concatenate(docs) if docs else np.zeros(0, dtype)).astype(dtype, copy=False), offsets
