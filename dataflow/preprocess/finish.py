"""The end of a `dataflow tokenize` run: the tokenizer beside each split, the manifests, the work folder gone.

The manifests are the commit point of a run: written over the shards the journal lists, each atomically;
once every split has one, the work folder (journal, scratch) is removed. A kill in between leaves the
journal, and the rerun writes the manifests again.
"""

from __future__ import annotations

import os
import shutil
import time
from typing import TYPE_CHECKING, Any

import fsspec

from dataflow.errors import InputError
from dataflow.formats.manifest import MANIFEST_NAME, Manifest, ShardInfo, TokenizerMeta, read_manifest, write_manifest
from dataflow.preprocess import output
from dataflow.preprocess.config import framed_meta
from dataflow.preprocess.journal import Progress
from dataflow.preprocess.layout import OutputLayout
from dataflow.sources import input_kind
from dataflow.tokenizers.load import Tokenizer
from dataflow.version import __version__

if TYPE_CHECKING:
    from dataflow.preprocess.task import TaskRun


def copy_tokenizer(layout: OutputLayout, tok: Tokenizer) -> dict[str, TokenizerMeta]:
    """The tokenizer's file beside each split's manifest, and the metadata that names it (with the framing of
    the documents, which `startup.unit_spec` kept on `tok`)."""
    metas = {}
    for split in layout.splits:
        metas[split] = _framed(tok, tok.copy_into(layout.staging_dir(split)))
        if metas[split].file:
            layout.publish(split, metas[split].file)
    return metas


def _framed(tok: Tokenizer, meta: TokenizerMeta) -> TokenizerMeta:
    framing = getattr(tok, "framing", None)
    return meta if framing is None else framed_meta(meta, framing)


def write_manifests(run: TaskRun, progress: Progress, metas: dict[str, TokenizerMeta]) -> dict[str, dict[str, int]]:
    """Every split's manifest over the shards the journal lists; then the work folder goes."""
    cfg, layout, plan = run.cfg, run.layout, run.plan
    provenance: dict[str, Any] = {"inputs": run.files, "input_files": plan.inputs,  # [name in ids, bytes] each
                                  "settings": run.settings, "dataflow": __version__,
                                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if cfg.tasked:
        provenance["task"] = {"index": cfg.task_index, "of": cfg.num_tasks, "bundles": list(plan.task_bundles)}
    datasets = {}
    for split in layout.splits:
        listed = progress.shards.get(split, [])
        shards = [ShardInfo(**{k: v for k, v in s.items() if k != "tag"}) for s in listed]
        m = Manifest(tokenizer=metas[split], format=cfg.format, compression=cfg.compression,
                     dtype=metas[split].dtype, shards=shards, provenance=provenance)
        layout.check_placed(split, listed)
        write_manifest(layout.staging_dir(split), m)  # atomically
        layout.publish(split, MANIFEST_NAME)  # (an object store's commit point: one PUT)
        datasets[split] = _counts(m)
    layout.publish_error_log()
    layout.remove_work()  # the run is done: a rerun finds the manifests and nothing to resume
    return datasets


def refuse_empty(run: TaskRun, progress: Progress) -> None:
    """An `InputError` instead of a dataset of no document (training on it fails later, far from the cause):
    the inputs held no record, or every record was bad (and the error log says why, each)."""
    if progress.documents:
        return
    layout, files = run.layout, run.files
    what = files[0] if len(files) == 1 else f"the {len(files)} input files"
    jsonl = bool(files) and all(input_kind(f) == "jsonl" for f in files)  # the hint is JSONL's only
    if progress.errors == 0:  # nothing to show: the run leaves nothing behind
        shutil.rmtree(layout.work)
        os.remove(layout.errors)
        raise InputError(f"{what}: no document read (the input holds no record); check the path and the input "
                         f"format{' (JSONL: one JSON object a line)' if jsonl else ''}")
    log = layout.errors
    raise InputError(f"{what}: no document read: all {progress.errors} records were bad, each listed with its "
                     f"reason in {log}{' (JSONL wants one JSON object a line, not one JSON array)' if jsonl else ''}"
                     f"; fix the input, then rerun with --overwrite")


def finished_counts(layout: OutputLayout) -> tuple[dict[str, dict[str, int]], int, int, int]:
    """Of a run finished before: each split's counts, and its documents, tokens and bad records in all."""
    datasets, docs, tokens = {}, 0, 0
    for split in layout.splits:
        m = read_manifest(output.join(layout.writer_dir(split), MANIFEST_NAME))
        datasets[split] = _counts(m)
        docs, tokens = docs + m.documents, tokens + m.tokens
    errors = 0
    if layout.exists(layout.errors_url):
        with fsspec.open(layout.errors_url, "rb") as f:
            errors = sum(1 for _ in f)
    return datasets, docs, tokens, errors


def _counts(m: Manifest) -> dict[str, int]:
    return {"documents": m.documents, "tokens": m.tokens, "shards": len(m.shards), "bytes": m.bytes}
