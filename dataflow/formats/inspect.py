"""`dataflow inspect`: a dataset described (manifest, shard table, documents decoded by the caller)."""

from __future__ import annotations

from typing import Any, Iterable

from dataflow.formats.manifest import Manifest
from dataflow.units import count


def describe(dataset: str, manifest: Manifest, documents: Iterable[dict[str, str]] = ()) -> dict[str, Any]:
    """The manifest as a dict, with its path and the decoded `documents` to show ({"id", "text"})."""
    d = manifest.to_dict()
    d["path"] = dataset
    docs = list(documents)
    if docs:
        d["documents"] = docs
    return d


def format_description(info: dict[str, Any]) -> str:
    t, tot = info["tokenizer"], info["totals"]
    lines = [
        f"dataset   {info['path']}",
        f"format    {info['format']} ({info['compression']}), tokens {info['dtype']}, version {info['version']}",
        f"tokenizer {t['name']} ({t['kind']}), vocab {t['vocab_size']:,}, eos {t['eos_id']}",
        f"totals    {count(tot['documents'], 'document')}, {count(tot['tokens'], 'token')}, "
        f"{count(tot['shards'], 'shard')}, "
        f"{tot['bytes'] / 1e6:.2f} MB on disk",
        "",
        f"{'shard':<28} {'documents':>10} {'tokens':>14} {'MB':>9}  sha256",
    ]
    for s in info["shards"]:
        lines.append(f"{s['path']:<28} {s['documents']:>10,} {s['tokens']:>14,} {s['bytes'] / 1e6:>9.2f}  "
                     f"{s['sha256'][:16]}")
    for doc in info.get("documents", []):
        text = doc["text"] if len(doc["text"]) <= 500 else doc["text"][:500] + " …"
        lines += ["", f"--- {doc['id']}", text]
    return "\n".join(lines)
