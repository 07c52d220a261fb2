"""`dataflow inspect` and `dataflow decode`: a dataset described, and its documents back as text."""

from __future__ import annotations

import itertools
from typing import Any, Iterator

from dataflow.formats.manifest import Manifest
from dataflow.formats.reader import iter_documents
from dataflow.preprocess.tokenizers import tokenizer_for_dataset


def decode_documents(dataset: str, manifest: Manifest) -> Iterator[dict[str, str]]:
    """Every document as {"id", "text"}, in stored order."""
    tok = tokenizer_for_dataset(dataset, manifest.tokenizer)
    for doc_id, tokens in iter_documents(dataset, manifest):
        yield {"id": doc_id, "text": tok.decode(tokens)}


def describe(dataset: str, manifest: Manifest, decode: int = 0) -> dict[str, Any]:
    d = manifest.to_dict()
    d["path"] = dataset
    if decode:
        d["documents"] = list(itertools.islice(decode_documents(dataset, manifest), decode))
    return d


def format_description(info: dict[str, Any]) -> str:
    t, tot = info["tokenizer"], info["totals"]
    lines = [
        f"dataset   {info['path']}",
        f"format    {info['format']} ({info['compression']}), tokens {info['dtype']}, version {info['version']}",
        f"tokenizer {t['name']} ({t['kind']}), vocab {t['vocab_size']:,}, eos {t['eos_id']}",
        f"totals    {tot['documents']:,} documents, {tot['tokens']:,} tokens, {tot['shards']} shards, "
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
