"""Shard paths over HTTP: each segment is quoted, so `#`, `?`, `%`, spaces and non-ASCII are parts of a
name; a path whose percent-decoded form leaves the dataset is refused before anything is requested.

A real HTTP server on 127.0.0.1 serves a folder; it records every path it is asked for.
"""

import json
import os
import shutil
from urllib.parse import unquote

import numpy as np
import pytest
import torch

from dataflow import FormatError, ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta
from dataflow.formats import remote
from support.http_files import serve

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
SEQ = 16
ODD_NAMES = ["shard #1.arrow", "what?.arrow", "100%.arrow", "sub dir/ü ñ.arrow", "a%2Fb.arrow", "plus+and=;.arrow",
             "%41.arrow"]


@pytest.fixture
def served(tmp_path):
    """(folder served, its URL, the request paths seen)."""
    with serve(tmp_path / "www") as (url, asked, failing):
        yield tmp_path / "www", url, asked


def _dataset(out, compression):
    with ShardWriter(str(out), tokenizer_meta=BYTES, shard_size="4KB", compression=compression) as w:
        for i in range(40):
            w.write((np.arange(i, i + 500) % 256).astype(np.uint16), id=f"d{i}")
    with open(out / "index.json") as f:
        return json.load(f)


def _rename(ds, manifest, names):
    """Move shard k to names[k] (folders made), and say so in the manifest."""
    for shard, name in zip(manifest["shards"], names):
        os.makedirs(os.path.dirname(ds / name), exist_ok=True)
        os.replace(ds / shard["path"], ds / name)
        shard["path"] = name
    (ds / "index.json").write_text(json.dumps(manifest))


def _windows(source, **kwargs):
    ds = StreamingDataset(source, seq_len=SEQ, shuffle=False, **kwargs)
    out = [b["input_ids"].clone() for b in StreamingDataLoader(ds, batch_size=2)]
    ds.close()  # its downloads ahead are done before the server goes
    return out


@pytest.mark.parametrize("compression", ["zstd", "none"])
def test_shard_names_with_url_syntax_in_them_are_read_over_http(served, tmp_path, compression):
    www, url, asked = served
    manifest = _dataset(www / "ds", compression)
    assert len(manifest["shards"]) >= len(ODD_NAMES)
    _rename(www / "ds", manifest, ODD_NAMES)
    want = _windows(str(www / "ds"))  # the same dataset read in place
    got = _windows(f"{url}/ds", cache_dir=str(tmp_path / "cache"))
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    assert all(p.startswith("/ds/") for p in asked)
    for name in ODD_NAMES:  # asked for by its quoted name, which the server decodes back to the file
        assert any(unquote(p) == f"/ds/{name}" for p in asked), name


HOSTILE = ["%2e%2e/secret.arrow", "%2E%2E/secret.arrow", "sub/%2e%2e/%2e%2e/secret.arrow", "..%2fsecret.arrow",
           "%252e%252e/secret.arrow", "%2fsecret.arrow", "%2e%2e%2fsecret.arrow", "sub%5c..%5c..%5csecret.arrow"]


@pytest.mark.parametrize("hostile", HOSTILE)
def test_a_percent_encoded_escape_is_refused_before_any_request(served, tmp_path, hostile):
    """The file the hostile path points at exists (outside the dataset) and matches the manifest's sha256:
    reading it would silently train on data from elsewhere."""
    www, url, asked = served
    manifest = _dataset(www / "ds", "zstd")
    shutil.move(str(www / "ds" / manifest["shards"][0]["path"]), str(www / "secret.arrow"))
    manifest["shards"][0]["path"] = hostile
    (www / "ds" / "index.json").write_text(json.dumps(manifest))
    with pytest.raises(FormatError, match=r"leaves it \(read as .*damaged or hostile"):
        StreamingDataset(f"{url}/ds", seq_len=SEQ, shuffle=False, cache_dir=str(tmp_path / "cache"))
    with pytest.raises(FormatError, match=r"leaves it \(read as .*damaged or hostile"):
        remote.shard_url(f"{url}/ds", hostile)  # the reader's own guard, for manifests checked elsewhere
    assert all(p.startswith("/ds/") for p in asked), asked
    assert not any("secret" in unquote(unquote(p)) for p in asked), asked
