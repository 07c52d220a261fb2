"""A compressed input that ends early is an error naming the file, never a short dataset.

zstd streams of several frames of every kind (checksums or not, content sizes or not, RLE, raw and
compressed blocks, skippable frames) are cut at every byte near a frame boundary and elsewhere: a cut
inside a frame is refused, a cut between two frames is a valid shorter file (no reader can tell it from
a whole one). Then through the CLI: cut `.jsonl.zst` (the path where one file is split into pieces for
the workers, 1 and 2 workers), `.txt.zst`, `.gz`, `.bz2`, `.xz`; empty files; and files named for a
codec they are not in, which are one line, not a traceback.
"""

from __future__ import annotations

import bz2
import gzip
import io
import json
import lzma
import struct

import numpy as np
import pytest
import zstandard

from dataflow.cli import main
from dataflow.errors import InputError
from dataflow.sources.compressed import decompressed, read_errors

COMPRESS = {".zst": lambda b: zstandard.ZstdCompressor(level=3).compress(b), ".gz": gzip.compress,
            ".bz2": bz2.compress, ".xz": lambda b: lzma.compress(b, preset=1)}


def frames() -> list[tuple[bytes, bytes]]:
    """(compressed frame, its content) of each kind the format allows, in one stream."""
    rng = np.random.default_rng(0)
    text = b"".join(b'{"text": "line %d of the corpus"}\n' % i for i in range(40))
    noise = rng.integers(0, 256, 300, dtype=np.uint8).tobytes()  # incompressible: a raw block
    skippable = struct.pack("<II", 0x184D2A53, 7) + b"seektbl"
    plain = zstandard.ZstdCompressor(write_checksum=False, write_content_size=False)
    streamed = plain.compressobj()
    return [
        (zstandard.ZstdCompressor(write_checksum=True).compress(text), text),
        (skippable, b""),
        (plain.compress(noise), noise),
        (zstandard.ZstdCompressor(write_checksum=True).compress(b"a" * 5000), b"a" * 5000),  # an RLE block
        (streamed.compress(text[:500]) + streamed.flush(), text[:500]),  # no content size in the header
        (zstandard.ZstdCompressor().compress(b""), b""),
    ]


def read_all(data: bytes) -> bytes:
    with read_errors("cut.zst"), decompressed(io.BytesIO(data), "zstd", "cut.zst", read_size=64) as f:
        return f.read()


def test_a_zstd_stream_cut_inside_a_frame_is_refused_and_between_frames_reads_the_frames_before():
    parts = frames()
    stream = b"".join(f for f, _ in parts)
    ends = list(np.cumsum([len(f) for f, _ in parts]))
    contents = [b"".join(c for _, c in parts[:k]) for k in range(len(parts) + 1)]
    near = {e + d for e in [0, *ends] for d in range(-5, 6)}
    cuts = sorted(c for c in near | set(range(0, len(stream), 7)) if 0 <= c <= len(stream))
    for cut in cuts:
        if cut in ends:  # between two frames: a whole file of the frames before
            assert read_all(stream[:cut]) == contents[ends.index(cut) + 1], cut
        else:
            with pytest.raises(InputError, match="cut.zst: the compressed stream ends early") as e:
                read_all(stream[:cut])
            assert ("the file is empty" if cut == 0 else "stops inside a zstd frame") in str(e.value), cut
    assert read_all(stream) == contents[-1]


def test_bytes_after_the_last_frame_are_damage_not_more_frames():
    whole = zstandard.ZstdCompressor().compress(b"hello\n")
    with pytest.raises(InputError, match=r"damaged compressed stream \(no zstd frame starts at byte"):
        read_all(whole + b"\x00" * 16)


@pytest.fixture(scope="module")
def corpus(kjv) -> bytes:
    with open(kjv, "rb") as f:
        return zstandard.ZstdDecompressor().stream_reader(f).read()


@pytest.fixture()
def tokenize(capsys):
    """`dataflow tokenize SRC -o OUT ...` in this process: (exit code, stdout, stderr); an exception that is not
    a one-line error fails the test."""
    def run(src, out, *extra) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main(["tokenize", str(src), "-o", str(out), "--no-progress", "--unit-size", "256KB",
                     *map(str, extra)])
        cap = capsys.readouterr()
        return code, cap.out, cap.err
    return run


def assert_refused(result: tuple[int, str, str], out, *words: str) -> None:
    code, _, err = result
    assert code == 1 and err.count("\n") == 1 and all(w in err for w in words), err
    assert not (out / "index.json").exists()  # no (short) dataset


def zstd_frames_of(data: bytes, lines_per_frame: int) -> tuple[bytes, list[int]]:
    """`data` as a zstd stream of one frame per `lines_per_frame` lines, and where each frame ends."""
    lines = data.splitlines(keepends=True)
    frames = [zstandard.ZstdCompressor(level=3).compress(b"".join(lines[i:i + lines_per_frame]))
              for i in range(0, len(lines), lines_per_frame)]
    return b"".join(frames), list(np.cumsum([len(f) for f in frames]))


@pytest.mark.parametrize("workers", [1, 2])
def test_a_cut_multi_frame_jsonl_zst_is_an_error_naming_it(tmp_path, corpus, tokenize, workers):
    stream, ends = zstd_frames_of(corpus, 100)
    src = tmp_path / "kjv.jsonl.zst"
    src.write_bytes(stream[:ends[6] + 1000])  # inside the 8th frame: 700 whole lines before the cut
    assert_refused(tokenize(src, tmp_path / "out", "--workers", workers), tmp_path / "out", str(src), "ends early",
                   "incomplete")


def test_a_multi_frame_jsonl_zst_cut_between_frames_is_a_whole_shorter_file(tmp_path, corpus, tokenize):
    stream, ends = zstd_frames_of(corpus, 100)
    src = tmp_path / "kjv.jsonl.zst"
    src.write_bytes(stream[:ends[6]])
    code, out, err = tokenize(src, tmp_path / "out", "--workers", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["documents"] == 700 and json.loads(out)["errors"] == 0


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".zst"])
@pytest.mark.parametrize("kind", ["jsonl", "txt"])
def test_every_codec_cut_short_is_an_error_naming_it(tmp_path, corpus, tokenize, suffix, kind):
    data = COMPRESS[suffix](corpus[:1_000_000])
    src = tmp_path / f"kjv.{kind}{suffix}"
    src.write_bytes(data[:len(data) * 6 // 10])
    assert_refused(tokenize(src, tmp_path / "out", "--workers", "2"), tmp_path / "out", str(src), "ends early")


@pytest.mark.parametrize("suffix", [".gz", ".bz2", ".xz", ".zst"])
def test_an_empty_compressed_file_is_an_error(tmp_path, tokenize, suffix):
    src = tmp_path / f"empty.jsonl{suffix}"
    src.write_bytes(b"")
    assert_refused(tokenize(src, tmp_path / "out"), tmp_path / "out", str(src), "ends early (the file is empty)")


@pytest.mark.parametrize("suffix, name", [(".gz", "a gzip"), (".bz2", "a bzip2"), (".xz", "an xz"),
                                          (".zst", "a zstd"), (".zstd", "a zstd")])
@pytest.mark.parametrize("kind", ["jsonl", "txt"])
def test_a_file_named_for_a_codec_it_is_not_in_is_one_line(tmp_path, corpus, tokenize, suffix, name, kind):
    src = tmp_path / f"kjv.{kind}{suffix}"
    src.write_bytes(corpus[:100_000])
    assert_refused(tokenize(src, tmp_path / "out", "--workers", "2"), tmp_path / "out", str(src),
                   f"not {name} file", "give it the extension of what it holds")


def test_after_the_file_is_replaced_whole_the_rerun_resumes_to_the_bytes_of_a_clean_run(tmp_path, corpus, tokenize):
    from support.cli import dataset_bytes

    stream, ends = zstd_frames_of(corpus, 100)
    src = tmp_path / "kjv.jsonl.zst"
    src.write_bytes(stream)
    assert tokenize(src, tmp_path / "ref", "--workers", "2")[0] == 0
    src.write_bytes(stream[:ends[-3] - 10])
    assert_refused(tokenize(src, tmp_path / "out", "--workers", "1"), tmp_path / "out", "ends early")
    assert json.loads((tmp_path / "out" / "_work" / "task-00000" / "journal.json").read_text())["next_piece"] > 0
    src.write_bytes(stream)
    code, out, err = tokenize(src, tmp_path / "out", "--workers", "1", "--json")
    assert code == 0, err
    assert dataset_bytes(tmp_path / "out") == dataset_bytes(tmp_path / "ref")
