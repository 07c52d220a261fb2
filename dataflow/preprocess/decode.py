"""Documents back as text: a dataset's tokens through the tokenizer it was written with (its copy)."""

from __future__ import annotations

from typing import Iterator

from dataflow.formats.manifest import Manifest
from dataflow.formats.reader import iter_documents
from dataflow.preprocess.tokenizers import tokenizer_for_dataset


def decode_documents(dataset: str, manifest: Manifest) -> Iterator[dict[str, str]]:
    """Every document as {"id", "text"}, in stored order."""
    tok = tokenizer_for_dataset(dataset, manifest.tokenizer)
    for doc_id, tokens in iter_documents(dataset, manifest):
        yield {"id": doc_id, "text": tok.decode(tokens)}
