"""Tar shards: one strict definition of a valid shard, shared by `verify`, the loader and `decode`.

Real shards (KJV text, byte tokens) are damaged in memory and put back with a manifest entry that matches
their new bytes (size and sha256), as a buggy tool or an attacker would leave them: the three readers
must then agree, each giving the same documents or a one-line `FormatError`, in bounded time and memory.
"""

import hashlib
import io
import json
import os
import pathlib
import tarfile

import numpy as np
import pytest
import zstandard

from dataflow import FormatError, ShardWriter, StreamingDataset, TokenizerMeta
from dataflow.cli import main
from dataflow.formats.manifest import read_manifest
from dataflow.formats.reader import iter_documents

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
DOCS = 24


def kjv_docs(kjv, n: int = DOCS) -> list[tuple[str, np.ndarray]]:
    with open(kjv, "rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as r:
        lines = r.read(1 << 20).decode("utf-8", "ignore").splitlines()[:n]
    texts = [json.loads(line)["text"][:600] for line in lines]
    return [(f"kjv-{i}", np.frombuffer(t.encode(), np.uint8).astype(np.uint16)) for i, t in enumerate(texts)]


def make(out, docs, compression: str) -> str:
    with ShardWriter(str(out), tokenizer_meta=BYTES, format="tar", compression=compression, shard_size="1GB") as w:
        for doc_id, tokens in docs:
            w.write(tokens, id=doc_id)
    return str(out)


def shard_file(path: str) -> str:
    return os.path.join(path, read_manifest(path).shards[0].path)


def tar_stream(path: str) -> bytes:
    data = pathlib.Path(shard_file(path)).read_bytes()
    return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 30) if data[:4] == b"\x28\xb5\x2f\xfd" \
        else data


def put(path: str, raw: bytes, compress: bool | None = None) -> None:
    """Write `raw` as the shard (compressed when the shard is a .tar.zst) and make the manifest agree with
    the file's new size and sha256."""
    name = shard_file(path)
    data = zstandard.ZstdCompressor().compress(raw) if (compress if compress is not None else name.endswith(".zst")) \
        else raw
    with open(name, "wb") as f:
        f.write(data)
    index = os.path.join(path, "index.json")
    d = json.loads(pathlib.Path(index).read_text())
    d["shards"][0].update(bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    d["totals"]["bytes"] = len(data)
    pathlib.Path(index).write_text(json.dumps(d))


def headers(raw: bytes) -> list[int]:
    """Offsets of the member headers of a well-formed tar stream."""
    out, pos = [], 0
    while raw[pos:pos + 512] != bytes(512):
        out.append(pos)
        pos += 512 + -(-int(raw[pos + 124:pos + 136].strip(b"\0 ") or b"0", 8) // 512) * 512
    return out


def set_field(raw: bytes, header: int, start: int, end: int, value: bytes, fix_checksum: bool = True) -> bytes:
    b = bytearray(raw)
    b[header + start:header + end] = value.ljust(end - start, b"\0")[:end - start]
    if fix_checksum:
        b[header + 148:header + 156] = b" " * 8
        b[header + 148:header + 156] = b"%06o\0 " % sum(b[header:header + 512])
    return bytes(b)


FIELDS = {"name": (0, 100), "mode": (100, 108), "size": (124, 136), "chksum": (148, 156), "type": (156, 157),
          "magic": (257, 263), "prefix": (345, 500)}


def outcomes(path: str, capsys) -> dict:
    """What verify, decode's reader and the loader make of a dataset: its documents, or the error."""
    out = {}
    code = main(["verify", path, "--no-progress"])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "unreadable (" not in err, err
    out["verify"] = "ok" if code == 0 else "bad"
    try:
        out["decode"] = [(i, t.tolist()) for i, t in iter_documents(path, read_manifest(path))]
    except FormatError as e:
        out["decode"] = e
    try:
        out["loader"] = [(d["id"], d["tokens"].tolist()) for d in StreamingDataset(path, shuffle=False)]
    except FormatError as e:
        out["loader"] = e
    return out


def assert_agree(out: dict, what: str) -> None:
    errors = {k: v for k, v in out.items() if isinstance(v, FormatError)}
    if out["verify"] == "bad":
        assert len(errors) == 2, f"{what}: verify refuses, but {set(out) - set(errors) - {'verify'}} read it"
        for e in errors.values():
            assert "\n" not in str(e) and str(e).startswith("/"), f"{what}: {e}"
    else:
        assert not errors, f"{what}: verify passes, but {errors}"
        assert out["decode"] == out["loader"], f"{what}: decode and the loader read different documents"
        assert len(out["decode"]) == DOCS


@pytest.fixture(scope="module")
def docs(kjv):
    return kjv_docs(kjv)


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_an_undamaged_shard_reads_the_same_everywhere(tmp_path, docs, capsys, compression):
    path = make(tmp_path / "d", docs, compression)
    out = outcomes(path, capsys)
    assert out["verify"] == "ok"
    assert out["decode"] == out["loader"] == [(i, t.tolist()) for i, t in docs]


def extra_member(raw: bytes, name: str, data: bytes, at: int) -> bytes:
    """`raw` with one more member inserted before the header at byte `at`."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    return raw[:at] + buf.getvalue()[:512 + -(-len(data) // 512) * 512] + raw[at:]


def pax_stream(docs) -> bytes:
    """The documents under names so long that tarfile writes a PAX extended header for each."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for j, (doc_id, tokens) in enumerate(docs):
            for ext, data in (("tokens.npy", npy(tokens)), ("json", json.dumps({"id": doc_id}).encode())):
                info = tarfile.TarInfo(f"{'k' * 120}{j:04d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.save(buf, arr, allow_pickle=False)
    return buf.getvalue()


def size_of(raw: bytes, index: int) -> int:
    at = headers(raw)[index]
    return int(raw[at + 124:at + 136].strip(b"\0 "), 8)


def replace_member(raw: bytes, index: int, data: bytes) -> bytes:
    """`raw` with member `index`'s body replaced by `data` (its header's size fixed)."""
    at, old = headers(raw)[index], size_of(raw, index)
    raw = set_field(raw, at, 124, 136, b"%011o" % len(data))
    return raw[:at + 512] + data + bytes(-len(data) % 512) + raw[at + 512 + -(-old // 512) * 512:]


# Shards that one reader or another accepted before they shared one parser.
CASES = {
    "a negative size (the read position stood still)": lambda raw, docs: set_field(
        set_field(raw, headers(raw)[2], 0, 100, b"000000001.txt"), headers(raw)[2], 124, 136, b"-0001000"),
    "a negative size that steps back": lambda raw, docs: set_field(raw, headers(raw)[3], 124, 136, b"-0002000"),
    "a size with a sign": lambda raw, docs: set_field(raw, headers(raw)[1], 124, 136, b"+%010o" % size_of(raw, 1)),
    "a base-256 size": lambda raw, docs: set_field(raw, headers(raw)[1], 124, 136, b"\x80" + bytes(10) + b"\x20"),
    "a size past the end": lambda raw, docs: set_field(raw, headers(raw)[-1], 124, 136, b"77777777777"),
    "a member the loader ignores": lambda raw, docs: extra_member(raw, "000000003.txt", b"hello", headers(raw)[8]),
    "a member the loader ignores, at the end": lambda raw, docs: extra_member(raw, "zzz.txt", b"x" * 700,
                                                                               headers(raw)[-1] + 1024),
    "PAX headers": lambda raw, docs: pax_stream(docs),
    "a 2-D token array": lambda raw, docs: replace_member(raw, 0, npy(docs[0][1][:300].reshape(3, 100))),
    "big-endian tokens": lambda raw, docs: replace_member(raw, 0, npy(docs[0][1].astype(">u2"))),
    "int64 tokens": lambda raw, docs: replace_member(raw, 0, npy(docs[0][1].astype(np.int64))),
    "bytes after the tokens": lambda raw, docs: replace_member(raw, 0, npy(docs[0][1]) + b"\0\0"),
    "a JSON list": lambda raw, docs: replace_member(raw, 1, b"[1, 2]"),
    "an id that is a number": lambda raw, docs: replace_member(raw, 1, b'{"id": 7}'),
    "deeply nested JSON": lambda raw, docs: replace_member(raw, 1, b"[" * 100_000),
    "json before tokens": lambda raw, docs: raw[:headers(raw)[0]] + raw[headers(raw)[1]:headers(raw)[2]]
    + raw[headers(raw)[0]:headers(raw)[1]] + raw[headers(raw)[2]:],
    "a bad checksum": lambda raw, docs: set_field(raw, headers(raw)[5], 100, 108, b"0000777", fix_checksum=False),
    "a symlink": lambda raw, docs: set_field(raw, headers(raw)[4], 156, 157, b"2"),
    "no end-of-archive block": lambda raw, docs: raw[:headers(raw)[-1] + 1024],
    "data after the end": lambda raw, docs: raw + b"more",
    "a member cut short": lambda raw, docs: raw[:headers(raw)[6] + 600],
}


@pytest.mark.parametrize("compression", ["none", "zstd"])
@pytest.mark.parametrize("case", list(CASES))
def test_verify_the_loader_and_decode_refuse_the_same_shards(tmp_path, docs, capsys, compression, case):
    path = make(tmp_path / "d", docs, compression)
    put(path, CASES[case](tar_stream(path), docs))
    out = outcomes(path, capsys)
    assert out["verify"] == "bad", f"verify passes a shard with {case}"
    assert_agree(out, case)
    assert "damaged tar shard" in str(out["loader"]) or "documents /" in str(out["loader"])


NASTY = {
    "size": [b"-0001000", b"-0002000", b"-1", b"77777777777", b"0", b"1_0", b" 12", b"\xff" * 12, b"9",
             b"\x80" + bytes(11)],
    "name": [b"x.txt", b"", b"a/b.json", b"000000000.tokens.npy", b"000000000.json", b".json", b"\xff\xfe.json",
             b"k" * 100],
    "type": [b"x", b"g", b"5", b"2", b"L", b"1", b"7"],
    "magic": [b"\0" * 6, b"ustar ", b"gnutar"],
    "chksum": [b"0", b"-1", b"7777777", b"\0" * 8],
    "mode": [b"\xff" * 8, b"-7"],
    "prefix": [b"p", b"a" * 155, b"\xff"],
}


def mutations(raw: bytes, rng: np.random.Generator, n: int) -> list[tuple[str, bytes]]:
    """`n` damaged copies of a tar stream: byte flips, header fields set to nasty values, cuts, appends."""
    hs = headers(raw)
    out = []
    for i in range(n):
        kind = i % 4
        if kind == 0:
            pos = int(rng.integers(0, len(raw)))
            b = bytearray(raw)
            b[pos] ^= int(rng.integers(1, 256))
            out.append((f"flip at byte {pos}", bytes(b)))
        elif kind in (1, 2):
            h, field = int(rng.choice(hs)), str(rng.choice(list(NASTY)))
            value = NASTY[field][int(rng.integers(0, len(NASTY[field])))]
            start, end = FIELDS[field]
            out.append((f"{field}={value[:20]!r} in the header at {h}",
                        set_field(raw, h, start, end, value, fix_checksum=field != "chksum")))
        else:
            cut = int(rng.integers(0, len(raw)))
            out.append((f"cut at byte {cut}", raw[:cut]) if i % 8 == 3 else
                       (f"{cut} more bytes", raw + bytes(rng.integers(0, 256, size=cut % 2000, dtype=np.uint8))))
    return out


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_fuzzed_shards_give_the_same_documents_everywhere_or_one_format_error(tmp_path, docs, capsys, compression):
    path = make(tmp_path / "d", docs, compression)
    raw = tar_stream(path)
    rng = np.random.default_rng(21 if compression == "none" else 22)
    refused = 0
    for what, damaged in mutations(raw, rng, 120):
        put(path, damaged)
        out = outcomes(path, capsys)
        assert_agree(out, what)
        refused += out["verify"] == "bad"
    assert refused >= 80  # most damage is caught; the rest (a token or padding byte) reads the same everywhere


def test_flipped_bytes_in_the_compressed_stream(tmp_path, docs, capsys):
    path = make(tmp_path / "d", docs, "zstd")
    data = pathlib.Path(shard_file(path)).read_bytes()
    rng = np.random.default_rng(5)
    for _ in range(40):
        pos = int(rng.integers(0, len(data)))
        b = bytearray(data)
        b[pos] ^= int(rng.integers(1, 256))
        put(path, bytes(b), compress=False)
        assert_agree(outcomes(path, capsys), f"flip at byte {pos} of the zstd stream")


def bomb(member: str, size: int) -> bytes:
    """A .tar.zst of one member of `size` zero bytes, compressed a megabyte at a time (a few KB in all)."""
    info = tarfile.TarInfo(member)
    info.size = size
    z = zstandard.ZstdCompressor().compressobj()
    out = [z.compress(info.tobuf(format=tarfile.USTAR_FORMAT))]
    zeros = bytes(1 << 20)
    for _ in range(size >> 20):
        out.append(z.compress(zeros))
    out += [z.compress(bytes(1024)), z.flush()]
    return b"".join(out)


@pytest.mark.parametrize("member", ["big.bin", "000000000.tokens.npy"])
@pytest.mark.parametrize("command", [["decode", "--no-progress", "-o", "out.jsonl"], ["inspect", "--decode", "1"]])
def test_decoding_a_tar_zst_that_declares_far_more_than_its_manifest_stays_bounded(tmp_path, docs, capsys, member,
                                                                                  command, monkeypatch):
    import tracemalloc

    path = make(tmp_path / "d", docs[:1], "zstd")
    put(path, bomb(member, 256 << 20), compress=False)  # 256 MB behind a manifest entry of one short document
    monkeypatch.chdir(tmp_path)
    tracemalloc.start()
    try:
        code = main([command[0], path, *command[1:]])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    err = capsys.readouterr().err
    assert code == 1 and "decompresses beyond the" in err and "its manifest entry allows" in err, err
    assert peak < 32 << 20, f"decoding held {peak / 1e6:.0f} MB"
    assert not (tmp_path / "out.jsonl").exists()


@pytest.mark.parametrize("damage", ["a size that is not octal", "int64 tokens", "one document too many"])
def test_errors_name_the_shard_not_the_caches_decoded_copy(tmp_path, docs, damage):
    """A local .tar.zst is read through its decoded copy in the cache; the error names the dataset's shard."""
    path = make(tmp_path / "d", docs, "zstd")
    raw = tar_stream(path)
    if damage == "a size that is not octal":
        raw = set_field(raw, headers(raw)[2], 124, 136, b"12345678x")
    elif damage == "int64 tokens":
        raw = replace_member(raw, 4, npy(docs[2][1].astype(np.int64)))
    else:
        more = io.BytesIO()
        with tarfile.open(fileobj=more, mode="w", format=tarfile.USTAR_FORMAT) as tar:
            for ext, data in (("tokens.npy", npy(docs[0][1])), ("json", b'{"id": "extra"}')):
                info = tarfile.TarInfo(f"zzz.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        raw = raw[:headers(raw)[-1] + 1024] + more.getvalue()
    put(path, raw)
    shard = shard_file(path)
    for kw in ({}, {"seq_len": 64}, {"decode_once": False}):
        with pytest.raises(FormatError) as e:
            list(StreamingDataset(path, shuffle=False, **kw))
        assert str(e.value).startswith(f"{shard}: ") and ".decoded" not in str(e.value), str(e.value)


def test_a_plain_tar_larger_than_its_manifest_allows_is_refused_unread(tmp_path, docs, capsys):
    path = make(tmp_path / "d", docs[:2], "none")
    raw = tar_stream(path)
    put(path, extra_member(raw, "000000000.txt", bytes(3 << 20), headers(raw)[0]))  # 3 MB the loader ignored
    out = outcomes(path, capsys)
    assert out["verify"] == "bad"
    assert_agree(out, "a 3 MB member")
    assert "is larger than the" in str(out["loader"]) and "its manifest entry allows" in str(out["loader"])


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_tar_streams_of_other_writers_are_read_when_their_members_are_plain(tmp_path, docs, capsys, fmt):
    """tarfile's GNU and PAX writers produce plain ustar headers for short names and integer fields: such a
    stream, with other modes, owners and mtimes than dataflow writes, is a valid shard."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tar:
        for j, (doc_id, tokens) in enumerate(docs):
            for ext, data in (("tokens.npy", npy(tokens)), ("json", json.dumps({"id": doc_id}).encode())):
                info = tarfile.TarInfo(f"sample{j:04d}.{ext}")
                info.size, info.mtime, info.mode, info.uname = len(data), 1_700_000_000 + j, 0o600, "someone"
                tar.addfile(info, io.BytesIO(data))
    for compression in ("none", "zstd"):
        path = make(tmp_path / compression, docs, compression)
        put(path, buf.getvalue())
        out = outcomes(path, capsys)
        assert out["verify"] == "ok"
        assert out["decode"] == out["loader"] == [(i, t.tolist()) for i, t in docs]
