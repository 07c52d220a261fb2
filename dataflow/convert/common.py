"""What every conversion shares: the tokenizer behind --tokenizer, local inputs, our datasets in batches."""

from __future__ import annotations

import os
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
    copied into `folder`). Nothing is encoded, so a tokenizer.json loads on `tokenizers` without proofs and a
    .tiktoken file needs no split pattern."""
    from dataflow.tokenizers.load import load_tokenizer

    engine = "hf" if spec != "bytes" and not spec.startswith("tiktoken:") else "auto"
    return load_tokenizer(spec, engine, decode_only=True).copy_into(folder)


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


def local_inputs(paths: list[str], what: str) -> list[str]:
    """The inputs as local paths (`file://PATH` is PATH): conversions memory-map their inputs, so a URL is
    refused, in one line, before any work."""
    for p in paths:
        if remote.is_remote(p):
            raise ConfigError(f"{p}: convert reads local {what}; download it first (e.g. with the "
                              f"fsspec/cloud CLI), then convert the local copy")
    return [remote.local_path(p) for p in paths]


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
    for p in local_inputs(paths, "datasets"):
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
