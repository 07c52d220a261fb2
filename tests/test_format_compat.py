"""Forward compatibility within a format version (docs/format.md)."""

import json

from conftest import write_random_dataset
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
