"""What every engine's ids are checked against: `tokenizers` itself (special-token strings as text), on the KJV
documents; Llama-3's split pattern."""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import zstandard
from tokenizers import Tokenizer as HF

from support.data import GPT2_JSON


LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


@pytest.fixture(scope="session")
def docs(kjv) -> list[str]:
    with open(kjv, "rb") as f:
        raw = zstandard.ZstdDecompressor().stream_reader(f).read()
    return [json.loads(line)["text"] for line in io.BytesIO(raw) if line.strip()]


def reference_ids(path, texts: list[str]) -> list[list[int]]:
    """What Hugging Face gives, special-token strings treated as text: the ids every engine must match."""
    ref = HF.from_file(str(path))
    ref.encode_special_tokens = True
    return [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]


def same_ids(got: list[np.ndarray], want: list[list[int]]) -> bool:
    return len(got) == len(want) and all(g.tolist() == w for g, w in zip(got, want))


@pytest.fixture(scope="session")
def gpt2_ref(docs) -> list[list[int]]:
    return reference_ids(GPT2_JSON, docs)
