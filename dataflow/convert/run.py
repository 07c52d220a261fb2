"""The four conversions: Megatron and nanoGPT files into a dataset, and a dataset into either.

Every one streams: sources are memory-mapped and handed on a batch of documents at a time, so memory
stays bounded whatever their size; outputs appear whole or not at all (temp files renamed at the end);
the same command gives the same bytes (no timestamps in what is written).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from dataflow.convert import megatron, nanogpt, outputs
from dataflow.convert.common import (BATCH_TOKENS, check_ids, dataset_batches, local_inputs, open_datasets,
                                     tokenizer_meta)
from dataflow.convert.outputs import dataset_output, refuse_overlap
from dataflow.errors import ConfigError
from dataflow.formats.atomic import atomic_open
from dataflow.formats.manifest import TokenizerMeta
from dataflow.formats.writer import DEFAULT_SHARD_SIZE, DocIds, ShardWriter
from dataflow.version import __version__

KINDS = ("megatron", "nanogpt")
Batches = Iterator[tuple[int, np.ndarray, np.ndarray]]  # (first document, tokens, offsets from 0)


class ConvertProgress:
    """What the conversions report to: `start(total tokens)` once the inputs are checked, then
    `update(tokens)` as they go. This one reports nowhere; the command shows a tqdm bar."""

    def start(self, total: int) -> None:
        pass

    def update(self, n: int) -> None:
        pass


@dataclass
class ConvertSummary:
    documents: int
    tokens: int
    outputs: list[str]
    shards: int = 0
    dtype: str = ""
    notes: list[str] = field(default_factory=list)


@dataclass
class WriteOptions:
    """How `--from` writes the dataset (the flags `dataflow tokenize` has for the same)."""

    format: str = "arrow"
    compression: str = "zstd"
    shard_size: int | str = DEFAULT_SHARD_SIZE
    overwrite: bool = False


def _write_dataset(kind: str, sources: list[str], batches: Callable[[str, TokenizerMeta], Batches], out: str,
                   spec: str, options: WriteOptions, progress: ConvertProgress, settings: dict,
                   total: int) -> ConvertSummary:
    """Write the documents of `sources` (in order; ids SOURCE:index) as one dataset at `out`."""
    refuse_overlap([p for source in sources for p in _files_of(kind, source)], [out])
    with dataset_output(out, options.overwrite) as tmp:
        meta = tokenizer_meta(spec, tmp)
        progress.start(total)
        provenance = {"inputs": sources, "settings": {"from": kind, "tokenizer": meta.name, **settings},
                      "dataflow": __version__}
        with ShardWriter(tmp, tokenizer_meta=meta, format=options.format, compression=options.compression,
                         shard_size=options.shard_size, provenance=provenance) as w:
            for source in sources:
                for first, tokens, offsets in batches(source, meta):
                    check_ids(tokens, offsets, meta.vocab_size, source, first)
                    w.write_batch(tokens.astype(meta.dtype), offsets, _ids(source, first, len(offsets) - 1))
                    progress.update(len(tokens))
        m = w.manifest()
    return ConvertSummary(m.documents, m.tokens, [out], len(m.shards), m.dtype)


def _files_of(kind: str, source: str) -> list[str]:
    """The files an input names: a Megatron prefix's .bin and .idx, or the nanoGPT file itself."""
    return list(megatron.paths(source)) if kind == "megatron" else [source]


def _ids(source: str, first: int, count: int) -> DocIds:
    """Ids SOURCE:first ... SOURCE:first+count-1, laid end to end as the writer takes them."""
    names = [f"{source}:{i}".encode() for i in range(first, first + count)]
    return DocIds(b"".join(names), np.concatenate([[0], np.cumsum([len(n) for n in names], dtype=np.int64)]))


def from_megatron(prefixes: list[str], out: str, spec: str, options: WriteOptions,
                  progress: ConvertProgress) -> ConvertSummary:
    """PREFIX.bin/.idx files (Megatron documents, in order, ids PREFIX:index) into one dataset."""
    prefixes = [megatron.strip_suffix(p) for p in local_inputs(prefixes, "Megatron files")]
    indices = {p: megatron.read_index(p) for p in prefixes}  # every input checked before any work
    return _write_dataset("megatron", prefixes,
                          lambda p, _: megatron.document_batches(indices[p], BATCH_TOKENS), out, spec, options,
                          progress, {"dtypes": [indices[p].dtype.name for p in prefixes]},
                          sum(i.tokens for i in indices.values()))


def from_nanogpt(files: list[str], out: str, spec: str, options: WriteOptions, progress: ConvertProgress,
                 dtype: str | None = None, eos_id: int | None = None) -> ConvertSummary:
    """Flat token files, split after each EOS (ids FILE:index), into one dataset."""
    files = local_inputs(files, "nanoGPT files")
    for f in files:
        if not os.path.isfile(f):
            raise ConfigError(f"{f}: no such file; --from nanogpt takes flat token files such as train.bin")
    dtypes = {f: nanogpt.file_dtype(f, dtype) for f in files}

    def batches(f: str, meta: TokenizerMeta) -> Batches:
        eos = meta.eos_id if eos_id is None else eos_id
        if not 0 <= eos < meta.vocab_size:
            raise ConfigError(f"--eos-id {eos} is not an id of the tokenizer (vocabulary {meta.vocab_size})")
        if eos > np.iinfo(dtypes[f]).max:  # no token of the file can be it: one document, silently
            raise ConfigError(f"{f}: EOS {eos} does not fit its {dtypes[f].name} tokens, so no document would "
                              f"end; pass --eos-id with the id the file ends documents with, or --dtype uint32")
        return nanogpt.document_batches(f, dtypes[f], eos)

    return _write_dataset("nanogpt", files, batches, out, spec, options, progress,
                          {"dtypes": [dtypes[f].name for f in files], "eos_id": eos_id},
                          sum(os.path.getsize(f) // dtypes[f].itemsize for f in files))


def to_megatron(datasets: list[str], prefix: str, overwrite: bool, progress: ConvertProgress) -> ConvertSummary:
    """Datasets into PREFIX.bin/.idx: one sequence per document, document indices 0..N, in stored order."""
    ds = open_datasets(datasets)
    prefix = megatron.strip_suffix(prefix)
    dtype = megatron.output_dtype(ds.tokenizer.vocab_size)
    refuse_overlap(ds.paths, list(megatron.paths(prefix)))
    with outputs.files(list(megatron.paths(prefix)), overwrite) as (bin_path, _):
        progress.start(ds.tokens)
        writer = megatron.MegatronWriter(megatron.strip_suffix(bin_path), dtype, ds.documents)
        try:
            for _, tokens, offsets, ids in dataset_batches(ds):
                writer.add(tokens, offsets, ids)
                progress.update(len(tokens))
            writer.commit()
        except BaseException:
            writer.abort()
            raise
    return ConvertSummary(ds.documents, ds.tokens, list(megatron.paths(prefix)), dtype=dtype.name)


def to_nanogpt(datasets: list[str], path: str, overwrite: bool, progress: ConvertProgress, dtype: str | None = None,
               eos_id: int | None = None) -> ConvertSummary:
    """Datasets into one flat token file: documents end to end as stored (with --eos-id: each followed by it)."""
    ds = open_datasets(datasets)
    out_dtype = nanogpt.output_dtype(path, ds.tokenizer.vocab_size, dtype)
    eos = ds.tokenizer.eos_id
    if eos_id is None and ds.eos is False:
        raise ConfigError(f"{datasets[0]} was tokenized with --no-eos: its documents would run into each other in a "
                          f"flat nanoGPT file; pass --eos-id N to put N after each document (EOS is {eos})")
    if eos_id is not None:
        if ds.eos:
            raise ConfigError(f"the documents of {datasets[0]} already end with EOS {eos}; drop --eos-id")
        if not 0 <= eos_id < min(ds.tokenizer.vocab_size, np.iinfo(out_dtype).max + 1):
            raise ConfigError(f"--eos-id {eos_id} is not an id of the tokenizer (vocabulary {ds.tokenizer.vocab_size})")
    refuse_overlap(ds.paths, [path])
    tokens_out = 0
    with outputs.files([path], overwrite) as (local,), atomic_open(local, "wb") as f:
        progress.start(ds.tokens)
        for first, tokens, offsets, ids in dataset_batches(ds):
            if eos_id is None:
                nanogpt.check_separated(tokens, offsets, ids, eos, first, ds.documents - 1)
            else:
                tokens = np.insert(tokens, offsets[1:], eos_id)
            data = np.ascontiguousarray(tokens, dtype=out_dtype)
            f.write(memoryview(data).cast("B"))
            tokens_out += len(data)
            progress.update(int(offsets[-1]))
    notes = [f"--eos-id {eos_id} after each document"] if eos_id is not None else []
    return ConvertSummary(ds.documents, tokens_out, [path], dtype=out_dtype.name, notes=notes)
