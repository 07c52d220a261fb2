"""Forward compatibility within a format version (docs/format.md)."""

import json

from support.data import write_random_dataset
from dataflow.formats.manifest import read_manifest


def test_manifest_fields_added_within_a_version_are_ignored(tmp_path):
    """docs/format.md: within a format version fields are only added, and readers ignore unknown ones."""
    ds = write_random_dataset(tmp_path / "ds", docs=20, seed=0, min_len=10, max_len=50)
    index = tmp_path / "ds" / "index.json"
    d = json.loads(index.read_text())
    d["future_top"] = 1
    d["tokenizer"]["future_field"] = "x"
    d["shards"][0]["future_field"] = [1, 2]
    index.write_text(json.dumps(d))
    m = read_manifest(ds)
    assert m.documents == 20 and m.tokenizer.name == "bytes"


def test_a_manifest_without_totals_reads_and_verifies(tmp_path, capsys):
    """`totals` are derived from the shard entries: a manifest written without them (by hand, by another
    tool) is read, verified and loaded like any other."""
    from dataflow import StreamingDataset
    from dataflow.cli import main

    ds = write_random_dataset(tmp_path / "ds", docs=20, seed=0, min_len=10, max_len=50)
    index = tmp_path / "ds" / "index.json"
    d = json.loads(index.read_text())
    del d["totals"]
    index.write_text(json.dumps(d))
    assert read_manifest(ds).totals_problem() is None
    assert main(["verify", ds, "--no-progress"]) == 0
    assert len(list(StreamingDataset(ds))) == 20
