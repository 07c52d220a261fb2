"""A cache that cannot take what the loader writes: a full disk while decoding, a folder that cannot be
written or made. Never a raw OSError, never a sound shard reported as damaged.

The failures are real system errors made where the test chooses: decoded copies written to /dev/full
(the kernel's ENOSPC), an exceeded quota (EDQUOT) from the sink, a file standing where the cache folder
should be (ENOTDIR), and a read-only folder (EROFS, or EACCES) for the paths under one folder.
"""

import errno
import io
import logging
import os

import fsspec
import numpy as np
import pyarrow as pa
import pytest
import torch

from dataflow import CacheFullError, ConfigError, ShardWriter, StreamingDataLoader, StreamingDataset, TokenizerMeta
from dataflow.formats import tar as tar_format
from dataflow.loading import cache

SEQ = 32
BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
DECODED_PART = ".decoded."  # decoded copies are written to <entry>.decoded.<fmt>.part-...


def _write(out, fmt="arrow"):
    with ShardWriter(str(out), tokenizer_meta=BYTES, format=fmt, shard_size="8KB", compression="zstd") as w:
        for i in range(40):
            w.write((np.arange(i, i + 700) % 256).astype(np.uint16), id=f"d{i}")
    return str(out)


@pytest.fixture(scope="module")
def arrow_ds(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("arrow"))


@pytest.fixture(scope="module")
def tar_ds(tmp_path_factory):
    return _write(tmp_path_factory.mktemp("tar"), "tar")


def _batches(ds, workers=0):
    return [b["input_ids"].clone() for b in StreamingDataLoader(ds, batch_size=2, num_workers=workers)]


def _decoded_part(path):
    return DECODED_PART in os.path.basename(str(path)) and ".part-" in str(path)


class _OverQuota(io.RawIOBase):
    def writable(self):
        return True

    def write(self, b):
        raise OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))


@pytest.fixture
def full_disk(monkeypatch):
    """Decoded copies (Arrow through pyarrow, tar through open()) are written where no space is left:
    `full_disk("ENOSPC")` to /dev/full, `full_disk("EDQUOT")` to a sink over its quota."""
    if not os.path.exists("/dev/full"):
        pytest.skip("needs /dev/full")
    real_osfile, real_open = pa.OSFile, open

    def arm(kind):
        def sink(path, mode="rb"):
            return _OverQuota() if kind == "EDQUOT" else real_open("/dev/full", "wb")

        monkeypatch.setattr(pa, "OSFile", lambda path, mode="r", **kw: (
            (sink(path) if kind == "EDQUOT" else real_osfile("/dev/full", "wb")) if _decoded_part(path)
            else real_osfile(path, mode, **kw)))
        monkeypatch.setattr(tar_format, "open", lambda path, mode="r", *a, **kw: (
            sink(path) if _decoded_part(path) and "w" in mode else real_open(path, mode, *a, **kw)), raising=False)

    return arm


@pytest.mark.parametrize("kind", ["ENOSPC", "EDQUOT"])
@pytest.mark.parametrize("fmt", ["arrow", "tar"])
def test_a_full_disk_while_decoding_is_cache_full_not_a_damaged_shard(arrow_ds, tar_ds, tmp_path, full_disk,
                                                                      kind, fmt):
    ds = StreamingDataset(arrow_ds if fmt == "arrow" else tar_ds, seq_len=SEQ, cache_dir=str(tmp_path / "c"))
    full_disk(kind)
    with pytest.raises(CacheFullError) as err:
        next(iter(StreamingDataLoader(ds, batch_size=2)))
    msg = str(err.value)
    assert "disk full while decoding" in msg and os.strerror(errno.__dict__[kind]) in msg
    assert "DATAFLOW_CACHE" in msg and "decode_once=False" in msg and "verify" not in msg
    assert not [p for p in (tmp_path / "c").rglob("*") if ".part-" in p.name]  # nothing half-written left


def test_a_full_disk_while_decoding_in_a_worker_reaches_the_user_as_cache_full(arrow_ds, tmp_path, full_disk):
    ds = StreamingDataset(arrow_ds, seq_len=SEQ, cache_dir=str(tmp_path / "c"))
    full_disk("ENOSPC")
    with pytest.raises(CacheFullError, match="disk full while decoding"):
        next(iter(StreamingDataLoader(ds, batch_size=2, num_workers=2)))


@pytest.fixture
def unwritable(monkeypatch):
    """`unwritable(folder, code)`: creating a file or folder under `folder` fails with `code` (a read-only
    file system, no permission, a full disk), whoever asks; reading is untouched."""
    real_open, real_mkdir = os.open, os.mkdir

    def arm(folder, code=errno.EROFS):
        folder = str(folder)

        def refused(path):
            return os.path.abspath(str(path)).startswith(folder)

        def fake_open(path, flags, *a, **kw):
            if refused(path) and flags & (os.O_CREAT | os.O_WRONLY | os.O_RDWR):
                raise OSError(code, os.strerror(code), str(path))
            return real_open(path, flags, *a, **kw)

        def fake_mkdir(path, *a, **kw):
            if refused(path):
                raise OSError(code, os.strerror(code), str(path))
            return real_mkdir(path, *a, **kw)

        monkeypatch.setattr(os, "open", fake_open)
        monkeypatch.setattr(os, "mkdir", fake_mkdir)

    return arm


def _falls_back(caplog, arrow_ds, cache_dir, workers=0):
    want = _batches(StreamingDataset(arrow_ds, seq_len=SEQ, decode_once=False))
    with caplog.at_level(logging.WARNING, logger="dataflow"):
        ds = StreamingDataset(arrow_ds, seq_len=SEQ, cache_dir=str(cache_dir))
        got = _batches(ds, workers)
    said = [r for r in caplog.records if "cannot be written" in r.getMessage()]
    assert len(said) == 1 and "DATAFLOW_CACHE" in said[0].getMessage()
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.mark.parametrize("workers", [0, 2])
def test_a_cache_folder_that_cannot_be_made_decodes_a_local_dataset_in_process(arrow_ds, tmp_path, caplog, workers):
    (tmp_path / "afile").write_text("not a folder")
    _falls_back(caplog, arrow_ds, tmp_path / "afile" / "cache", workers)


@pytest.mark.parametrize("code", [errno.EROFS, errno.EACCES, errno.ENOSPC, errno.EDQUOT])
def test_a_read_only_or_full_cache_decodes_a_local_dataset_in_process(arrow_ds, tmp_path, caplog, unwritable, code):
    (tmp_path / "c").mkdir()
    unwritable(tmp_path / "c", code)
    _falls_back(caplog, arrow_ds, tmp_path / "c")


def test_a_cache_that_turns_read_only_while_reading_falls_back_too(arrow_ds, tmp_path, caplog, unwritable):
    want = _batches(StreamingDataset(arrow_ds, seq_len=SEQ, decode_once=False))
    ds = StreamingDataset(arrow_ds, seq_len=SEQ, cache_dir=str(tmp_path / "c"))
    unwritable(tmp_path / "c")
    with caplog.at_level(logging.WARNING, logger="dataflow"):
        got = _batches(ds)
    assert any("cannot be written" in r.getMessage() for r in caplog.records)
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


@pytest.fixture
def remote_ds(arrow_ds):
    fs = fsspec.filesystem("memory")
    for name in os.listdir(arrow_ds):
        fs.pipe(f"/cache-failures/ds/{name}", open(os.path.join(arrow_ds, name), "rb").read())
    yield "memory://cache-failures/ds"
    fs.rm("/cache-failures", recursive=True)


@pytest.mark.parametrize("how", ["a file in the way", "read-only"])
def test_a_remote_dataset_with_an_unwritable_cache_is_one_line_naming_dataflow_cache(remote_ds, tmp_path, unwritable,
                                                                                   how):
    if how == "a file in the way":
        (tmp_path / "afile").write_text("not a folder")
        cache_dir = tmp_path / "afile" / "cache"
    else:
        cache_dir = tmp_path / "c"
        unwritable(cache_dir)
    with pytest.raises(ConfigError) as err:
        StreamingDataset(remote_ds, seq_len=SEQ, cache_dir=str(cache_dir))
    msg = str(err.value)
    assert "\n" not in msg and str(cache_dir) in msg and "DATAFLOW_CACHE" in msg
    assert isinstance(err.value, cache.CacheUnwritable)
