"""`dataflow merge OUT`: one manifest over the parts written by `--num-tasks K` task slices.

Each task writes `OUT/[split/]part-0000I/` with its own shards and manifest. Merging lists every part's
shards, in task order, under one `index.json` per split, without copying a byte of shard data. The
parts' unit ranges are contiguous in input order, so the merged dataset holds the same documents in
the same order as a single-machine run.
"""

from __future__ import annotations

import os
import shutil

from dataflow.errors import ConfigError, DataflowError
from dataflow.formats.manifest import MANIFEST_NAME, Manifest, ShardInfo, read_manifest, write_manifest


def _split_dirs(out: str) -> list[str]:
    splits = [os.path.join(out, s) for s in ("train", "val") if os.path.isdir(os.path.join(out, s))]
    return splits or [out]


def merge(out: str) -> dict[str, Manifest]:
    """Write `index.json` for each split of a task-sliced run; returns the merged manifests."""
    merged = {}
    for split_dir in _split_dirs(out):
        parts = sorted(d for d in os.listdir(split_dir) if d.startswith("part-"))
        if not parts:
            raise ConfigError(f"{split_dir}: no part-* folders to merge; was it written with --num-tasks?")
        first = None
        missing = []
        manifests = []
        for part in parts:
            path = os.path.join(split_dir, part, MANIFEST_NAME)
            if not os.path.exists(path):
                missing.append(part)
                continue
            manifests.append((part, read_manifest(path)))
        if manifests:
            first = manifests[0][1]
            expected = first.provenance["settings"]["num_tasks"]
            present = {int(p.split("-")[1]) for p in parts if p not in missing}
            missing += [f"part-{i:05d}" for i in range(expected) if i not in present and f"part-{i:05d}" not in missing]
        if missing or first is None:
            raise DataflowError(f"{split_dir}: tasks not finished: {', '.join(sorted(missing))}; rerun those "
                                f"task indices, then merge again")
        for part, m in manifests[1:]:
            if m.provenance.get("settings") != first.provenance.get("settings"):
                raise DataflowError(f"{split_dir}/{part} was made with other settings than part-00000")
        shards = [ShardInfo(f"{part}/{s.path}", s.documents, s.tokens, s.bytes, s.sha256)
                  for part, m in manifests for s in m.shards]
        tokenizer = first.tokenizer
        if tokenizer.file:
            shutil.copyfile(os.path.join(split_dir, manifests[0][0], tokenizer.file),
                            os.path.join(split_dir, tokenizer.file))
        provenance = dict(first.provenance)
        provenance.pop("task", None)
        provenance["parts"] = [part for part, _ in manifests]
        manifest = Manifest(tokenizer=tokenizer, format=first.format, compression=first.compression,
                            dtype=first.dtype, shards=shards, provenance=provenance)
        write_manifest(split_dir, manifest)
        merged[os.path.relpath(split_dir, out) if split_dir != out else "train"] = manifest
    return merged
