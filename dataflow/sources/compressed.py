"""Compressed inputs as streams of their decompressed bytes, checked: a cut file is an error, never a short input.

zstandard's stream reader answers end-of-file when its input ends, even in the middle of a frame, so a
`.zst` cut short would read like a whole, shorter file. The compressed bytes therefore pass through
`ZstdFrames`, which follows the frame structure header by header (not the content: that is the
decompressor's job) and refuses a stream that does not end between two frames. gzip, bz2 and xz raise
EOFError for a cut stream themselves. A compressed file that is empty, or that does not start with its
codec's header, is refused too, and every codec's error becomes one `InputError` line naming the file.

`open_decompressed` opens any input (compressed or not) this way.

A stream of several frames (gzip members, bz2 streams) cut exactly between two of them is a valid,
shorter file: no reader can tell it from a whole one.
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import zlib
from typing import IO, Iterator

import fsspec
import zstandard

from dataflow.debug import cause
from dataflow.errors import InputError
from dataflow.formats import remote
from dataflow.formats.remote_errors import explain, first_line, read_failed
from dataflow.sources.listing import split_compression

ZSTD_MAGIC = 0xFD2FB528
SKIPPABLE_MAGICS = range(0x184D2A50, 0x184D2A60)
LEGACY_ZSTD_MAGICS = range(0xFD2FB51E, ZSTD_MAGIC)  # zstd before 0.8: read by the decompressor, not followed here
MAGIC = {"gzip": b"\x1f\x8b", "bz2": b"BZh", "xz": b"\xfd7zXZ\x00"}
NAMES = {"zstd": "a zstd", "gzip": "a gzip", "bz2": "a bzip2", "xz": "an xz"}
INCOMPLETE = "the file is incomplete; copy or download it again"


class FrameError(ValueError):
    """Bytes that break the zstd frame structure, `at` a given compressed offset."""

    def __init__(self, message: str, at: int) -> None:
        super().__init__(message)
        self.at = at


class ZstdFrames:
    """Follows the frames of a zstd stream as its compressed bytes pass (RFC 8878: frame headers, block
    headers, checksums, skippable frames), skipping their content; says whether the bytes so far end
    between two frames. Raises FrameError for bytes that cannot be where they are."""

    def __init__(self) -> None:
        self.passed = 0  # compressed bytes fed so far
        self._state, self._want = "magic", 4  # the header being collected, and its size
        self._header = bytearray()
        self._skip = 0  # content bytes to pass before the next header
        self._checksum = False  # the current frame ends with a 4-byte checksum
        self._blind = False  # a legacy frame: its structure is not followed

    def between_frames(self) -> bool:
        return self._blind or (self._state == "magic" and not self._header and not self._skip)

    def feed(self, data: bytes) -> None:
        view, pos = memoryview(data), 0
        while pos < len(view) and not self._blind:
            if self._skip:
                step = min(self._skip, len(view) - pos)
                self._skip -= step
            else:
                step = min(self._want - len(self._header), len(view) - pos)
                self._header += view[pos:pos + step]
            pos += step
            if len(self._header) == self._want:
                header = int.from_bytes(self._header, "little")
                self._header.clear()
                self._next(header, self.passed + pos - self._want)
        self.passed += len(view)

    def _next(self, header: int, at: int) -> None:
        """Read one complete header (`at`: where it starts) and say what comes after it."""
        if self._state == "magic":
            if header == ZSTD_MAGIC:
                self._expect("descriptor", 1)
            elif header in SKIPPABLE_MAGICS:
                self._expect("skippable size", 4)
            elif header in LEGACY_ZSTD_MAGICS:
                self._blind = True
            else:
                raise FrameError(f"no zstd frame starts at byte {at}", at)
        elif self._state == "descriptor":
            if header & 0x08:
                raise FrameError(f"the zstd frame header at byte {at} sets a reserved bit", at)
            single_segment = header >> 5 & 1
            content_size = ((1 if single_segment else 0), 2, 4, 8)[header >> 6]
            rest = (1 - single_segment) + (0, 1, 2, 4)[header & 3] + content_size
            self._checksum = bool(header & 0x04)
            if rest:
                self._expect("frame header", rest)
            else:
                self._expect("block", 3)
        elif self._state == "frame header":
            self._expect("block", 3)
        elif self._state == "block":
            kind = header >> 1 & 3
            if kind == 3:
                raise FrameError(f"the zstd block header at byte {at} has the reserved block type", at)
            self._skip = 1 if kind == 1 else header >> 3  # an RLE block holds one byte
            if not header & 1:  # not the frame's last block
                self._expect("block", 3)
            elif self._checksum:
                self._expect("checksum", 4)
            else:
                self._expect("magic", 4)
        elif self._state == "checksum":
            self._expect("magic", 4)
        elif self._state == "skippable size":
            self._skip = header
            self._expect("magic", 4)

    def _expect(self, state: str, size: int) -> None:
        self._state, self._want = state, size


class CheckedSource:
    """The compressed file, read through for the decompressor: at its end, an empty file, a zstd stream that
    stops inside a frame, or a file that did not start with its codec's header is an `InputError`."""

    def __init__(self, raw: IO[bytes], codec: str, url: str) -> None:
        self._raw, self._codec, self._url = raw, codec, url
        self._frames = ZstdFrames() if codec == "zstd" else None
        self._head = b""  # the first bytes, to check the codec's header
        self.passed = 0

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        if data:
            self._check_head(data)
            if self._frames is not None:
                try:
                    self._frames.feed(data)
                except FrameError as e:
                    raise self._not_codec(str(e)) if e.at == 0 else damaged(self._url, str(e)) from cause(e)
            self.passed += len(data)
        elif self.passed == 0:
            raise truncated(self._url, "the file is empty")
        elif self._frames is not None and not self._frames.between_frames():
            raise truncated(self._url, f"it stops inside a zstd frame, after {self.passed} bytes")
        elif len(self._head) < len(MAGIC.get(self._codec, b"")):
            raise truncated(self._url, f"{self.passed} bytes, shorter than {NAMES[self._codec]} header")
        return data

    def _check_head(self, data: bytes) -> None:
        magic = MAGIC.get(self._codec)
        if magic is None or len(self._head) >= len(magic):
            return
        self._head += data[:len(magic) - len(self._head)]
        if not magic.startswith(self._head):
            raise self._not_codec(f"it starts with {self._head!r}")

    def _not_codec(self, detail: str) -> InputError:
        name = NAMES[self._codec]
        return InputError(f"{self._url}: not {name} file ({detail}); check the file, or give it the extension "
                          f"of what it holds")

    def readable(self) -> bool:
        return True

    def close(self) -> None:
        """The caller closes the file it opened."""


def truncated(url: str, detail: str) -> InputError:
    return InputError(f"{url}: the compressed stream ends early ({detail}): {INCOMPLETE}")


def damaged(url: str, detail: str) -> InputError:
    return InputError(f"{url}: damaged compressed stream ({detail}); the file is corrupt: copy or download it "
                      f"again")


def decompressed(raw: IO[bytes], codec: str, url: str, read_size: int | None = None) -> IO[bytes]:
    """A stream of the decompressed bytes of `raw`, a `codec` file (zstd, gzip, bz2, xz), checked as it is read.
    The caller closes `raw`; `read_size`: compressed bytes per read (zstd)."""
    source = CheckedSource(raw, codec, url)
    if codec == "zstd":
        sized = {} if read_size is None else {"read_size": read_size}
        return zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=True, closefd=False, **sized)
    if codec == "gzip":
        return gzip.GzipFile(fileobj=source, mode="rb")
    if codec == "bz2":
        return bz2.BZ2File(source, "rb")
    if codec == "xz":
        return lzma.LZMAFile(source, "rb")
    raise ValueError(f"unknown codec {codec!r}")


@contextlib.contextmanager
def read_errors(url: str) -> Iterator[None]:
    """Errors while reading `url` (its codec's, the storage's) as one `InputError` line naming it."""
    try:
        yield
    except InputError:
        raise
    except EOFError as e:  # gzip, bz2 and lzma: the stream ends inside a member
        raise truncated(url, str(e)) from cause(e)
    except (zstandard.ZstdError, gzip.BadGzipFile, zlib.error, lzma.LZMAError) as e:
        raise damaged(url, str(e)) from cause(e)
    except Exception as e:  # noqa: BLE001  (a remote backend's own types: aiohttp's, botocore's, ...)
        known = explain(url, e) if remote.is_remote(url) else None
        if known is None and remote.is_remote(url) and (remote.transient(e) or remote.status(e) is not None):
            known = read_failed(url, e)  # a server that kept failing, past the retries of the read
        if known is None and not isinstance(e, OSError):  # bz2 says "Invalid data stream" with an OSError
            raise
        raise known or InputError(f"{url}: cannot read ({type(e).__name__}: {first_line(e)})") from cause(e)


@contextlib.contextmanager
def open_decompressed(url: str, seek: bool = False) -> Iterator[IO[bytes]]:
    """A buffered, line-iterable binary stream of the file's decompressed bytes. A compressed file that ends
    early, or any error reading it, is an `InputError` naming it (also when raised by the caller's reads).

    HTTP files are streamed (block_size=0) unless the caller must seek, which needs range requests.
    """
    _, codec = split_compression(url)
    streaming = url.startswith(("http://", "https://")) and not seek
    with read_errors(url), fsspec.open(url, "rb", **({"block_size": 0} if streaming else {})) as raw:
        if codec is None:
            yield raw
        else:
            with decompressed(raw, codec, url) as stream, io.BufferedReader(stream, buffer_size=1 << 20) as f:
                yield f
