"""`dataflow inspect`: a dataset described (manifest, shard table, documents decoded by the caller)."""

from __future__ import annotations

from typing import Any, Iterable

from dataflow.formats.manifest import Manifest
from dataflow.sizes import count


def describe(dataset: str, manifest: Manifest, documents: Iterable[dict[str, str]] = ()) -> dict[str, Any]:
    """The manifest as a dict, with its path and the decoded `documents` to show ({"id", "text"})."""
    d = manifest.to_dict()
    d["path"] = dataset
    docs = list(documents)
    if docs:
        d["documents"] = docs
    return d


def framing_line(framing: dict[str, Any] | None) -> str:
    """The framing of the documents in words: what comes before and after each text, how special tokens were."""
    if framing is None:
        return ("not recorded (made before framing was: no BOS, EOS after each document unless --no-eos, "
                "special-token strings as text)")
    bos, eos = framing.get("bos_id"), framing.get("eos_id")
    rule = "as their ids" if framing.get("special_tokens") == "parse" else "as text"
    return (f"{'BOS ' + str(bos) if bos is not None else 'no BOS'} + text + "
            f"{'EOS ' + str(eos) if eos is not None else 'no EOS'}; special-token strings in text {rule}")


def format_description(info: dict[str, Any]) -> str:
    t, tot = info["tokenizer"], info["totals"]
    lines = [
        f"dataset   {info['path']}",
        f"format    {info['format']} ({info['compression']}), tokens {info['dtype']}, version {info['version']}",
        f"tokenizer {t['name']} ({t['kind']}), vocab {t['vocab_size']:,}, eos {t['eos_id']}",
        f"framing   {framing_line(t.get('framing'))}",
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
