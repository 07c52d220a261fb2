"""The small real data shipped in `tests/data/`, for the tests, the benchmarks and the tools.

The KJV corpus is used as it is (zstd JSONL); GPT-2's `tokenizer.json` and `gpt2.tiktoken` are stored
zstd-compressed and unpacked once, on first use, into a folder of the system's temporary directory named
by the content of the compressed files (so an edit in the repository never reuses a stale copy).
Nothing here reads outside the repository. Licenses: tests/data/LICENSES.md.
"""

from __future__ import annotations

import hashlib
import os
import pathlib
import tempfile

DATA = pathlib.Path(__file__).resolve().parents[1] / "tests" / "data"
KJV = DATA / "kjv.jsonl.zst"
_PACKED = {"tokenizer.json": DATA / "gpt2-tokenizer.json.zst", "gpt2.tiktoken": DATA / "gpt2.tiktoken.zst"}
# sha256 of the unpacked files: a damaged or truncated copy is never handed out
_SHA256 = {"tokenizer.json": "a73a055627f30e6a530741d6dd925a75c90b616f098e3734501cd4ca0aae7315",
           "gpt2.tiktoken": "306cd27f03c1a714eca7108e03d66b7dc042abe8c258b44c199a7ed9838dd930"}


def gpt2_dir(base: str | os.PathLike | None = None) -> pathlib.Path:
    """The folder holding GPT-2's `tokenizer.json` and `gpt2.tiktoken`, unpacking them if needed."""
    import zstandard

    key = hashlib.sha256(b"".join(p.read_bytes() for p in _PACKED.values())).hexdigest()[:16]
    out = pathlib.Path(base or tempfile.gettempdir()) / f"dataflow-test-data-{key}" / "gpt2"
    out.mkdir(parents=True, exist_ok=True)
    for name, packed in _PACKED.items():
        target = out / name
        if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == _SHA256[name]:
            continue
        data = zstandard.ZstdDecompressor().decompress(packed.read_bytes(), max_output_size=64 << 20)
        if hashlib.sha256(data).hexdigest() != _SHA256[name]:
            raise RuntimeError(f"{packed}: unpacks to a file whose sha256 is not GPT-2's {name}")
        fd, tmp = tempfile.mkstemp(dir=out, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)  # atomic: concurrent test sessions never see half a file
    return out


def gpt2_json() -> pathlib.Path:
    """GPT-2's Hugging Face `tokenizer.json` (vocab 50,257; `<|endoftext|>` = 50256)."""
    return gpt2_dir() / "tokenizer.json"


def gpt2_tiktoken() -> pathlib.Path:
    """GPT-2's ranks in tiktoken's `.tiktoken` format."""
    return gpt2_dir() / "gpt2.tiktoken"
