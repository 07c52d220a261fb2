"""tokenize's progress bar: counts as people read them, and a total that says when it is an estimate."""

from __future__ import annotations

import io

from dataflow.preprocess.plan import Unit
from dataflow.preprocess.progress import InputProgress


def _units(tmp_path):
    plain = Unit(index=0, file=str(tmp_path / "a.jsonl"), kind="jsonl", start=0, end=1000, size=1000)
    packed = Unit(index=1, file=str(tmp_path / "b.jsonl.zst"), kind="jsonl", start=0, end=None, size=500)
    return plain, packed


def test_counts_are_written_in_full_and_an_estimated_total_says_so(tmp_path, monkeypatch):
    import dataflow.preprocess.progress as progress

    plain, packed = _units(tmp_path)
    monkeypatch.setattr(progress, "splits_into_pieces", lambda u: u.file.endswith(".zst"))
    p = InputProgress([plain, packed], done=0, enabled=True)
    p.bar.fp = io.StringIO()
    assert p.bar.desc.startswith("tokenize (total estimated)")
    p.advance(plain, plain.size, documents=30_000, tokens=1_234_567)
    text = str(p.bar)
    assert "docs=30,000" in text and "tokens=1,234,567" in text and "3e+4" not in text
    piece = Unit(index=1, file=packed.file, kind="jsonl", start=0, size=2000, piece=0, last=True, read=500)
    p.advance(piece, packed.size, documents=30_001, tokens=1_300_000)
    assert p.bar.desc.rstrip(": ") == "tokenize" and p.bar.total == 3000  # the compressed file's real size, once read
    p.close()
