"""A local dataset that lost or damaged a shard is refused in one line, never read as other tokens."""

import os

import pytest

from support.data import write_random_dataset
from dataflow import FormatError, StreamingDataLoader, StreamingDataset


@pytest.fixture
def ds_path(tmp_path, monkeypatch):
    monkeypatch.setenv("DATAFLOW_CACHE", str(tmp_path / "cache"))
    return write_random_dataset(tmp_path / "ds", docs=300, seed=3, min_len=200)


def _epoch(ds: StreamingDataset) -> int:
    return sum(len(b["input_ids"]) for b in StreamingDataLoader(ds, batch_size=4))


def test_a_missing_shard_file_is_said_when_the_dataset_is_made(ds_path):
    os.remove(os.path.join(ds_path, "shard-00002.arrow"))  # an incomplete copy
    with pytest.raises(FormatError, match=r"shard-00002\.arrow: the manifest lists this shard but the file is "
                                          r"missing .* run `dataflow verify"):
        StreamingDataset(ds_path, seq_len=64)


@pytest.mark.parametrize("decode_once", [True, False])
def test_a_damaged_zstd_shard_is_refused_whether_decoded_once_or_in_each_process(ds_path, decode_once):
    path = os.path.join(ds_path, "shard-00001.arrow")
    data = bytearray(open(path, "rb").read())
    data[len(data) // 2] ^= 0x10  # inside a compressed record batch: zstd often decodes such a flip silently
    with open(path, "wb") as f:
        f.write(data)
    with pytest.raises(FormatError, match=r"shard-00001\.arrow.*sha256 does not match the manifest"):
        _epoch(StreamingDataset(ds_path, seq_len=64, shuffle=False, decode_once=decode_once))
