"""A `.tiktoken` file (a base64 token and its rank a line): its ranks checked, its encoding recognised.

The file holds ranks only; the split pattern, the special tokens and the EOS of its encoding are kept
elsewhere. The published files are recognised by sha256 and read as their encoding: OpenAI's (r50k_base,
p50k_base, cl100k_base, o200k_base) with what tiktoken's own registry (`tiktoken_ext.openai_public`) gives
them, Meta's Llama 3 `tokenizer.model` as Meta's tokenizer reads it. Any other file is read only with a split
pattern from the user (`--tiktoken-pattern`); it then has one special token, `<|endoftext|>` = the number of
ranks, its EOS (GPT-2's convention). Decoding needs the ranks alone.

The ranks are the token ids, and the vocabulary size (number of ranks) chooses the dtype the ids are stored
in: a rank past the end would be stored modulo 2^16. So a file is read only if its ranks are exactly 0..n-1,
each token once, every single byte ranked (tiktoken fails on text holding a byte it cannot rank).
"""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import logging
import os
import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dataflow.errors import ConfigError

if TYPE_CHECKING:
    import tiktoken

log = logging.getLogger(__name__)

OPENAI_ENCODINGS = ("r50k_base", "p50k_base", "cl100k_base", "o200k_base")
LLAMA3 = "llama3"
# Meta's Llama 3 (3.1, 3.2) `original/tokenizer.model`, 2,183,982 bytes: its sha256 as published on the Hub
LLAMA3_SHA256 = "82e9d31979e92ab929cd544440f129d9ecd797b69e327f80f17e1c50d5551b55"
ENCODINGS = OPENAI_ENCODINGS + (LLAMA3,)
# sha256 -> one of ENCODINGS: more files to read as that encoding (from Python, e.g. a test's own small file)
EXTRA_KNOWN_FILES: dict[str, str] = {}

# From Meta's llama3 repository, llama/tokenizer.py (`Tokenizer.pat_str` and the special tokens of
# `Tokenizer.__init__`, numbered from the number of ranks); its EOS is <|end_of_text|>.
LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_SPECIALS = (["<|begin_of_text|>", "<|end_of_text|>"] + [f"<|reserved_special_token_{i}|>" for i in range(4)]
                   + ["<|start_header_id|>", "<|end_header_id|>", "<|reserved_special_token_4|>", "<|eot_id|>"]
                   + [f"<|reserved_special_token_{i}|>" for i in range(5, 251)])
ENDOFTEXT = "<|endoftext|>"  # the EOS of a file read with the user's pattern
# decoding joins the tokens' bytes: no split pattern plays a part (an unknown file's pattern is not recorded)
DECODE_ONLY_PATTERN = r"[\s\S]+"

_REGISTRY_LOCK = threading.Lock()


@dataclass(frozen=True)
class TiktokenFile:
    """A checked `.tiktoken` file and the encoding it is read as: what tiktoken needs, the manifest's facts."""

    name: str  # the encoding's name, or the file's for one read with the user's pattern
    sha256: str  # of the file
    ranks: dict[bytes, int]
    pat_str: str
    special_tokens: dict[str, int]
    eos_id: int
    how: str  # where the pattern and the special tokens come from, for the log
    encodes: bool = True  # False: read to decode only (an unknown file, no pattern given)

    @property
    def vocab_size(self) -> int:
        return max([len(self.ranks) - 1, *self.special_tokens.values()]) + 1


def read(source: str, data: bytes, pattern: str | None = None, *, decode_only: bool = False) -> TiktokenFile:
    """The file `source` (its bytes `data`) as its encoding; a ConfigError of one line for a file whose ranks lie,
    an unknown file without `pattern`, or a pattern given for a file whose encoding has its own."""
    ranks = parse_ranks(data, source)
    sha256 = hashlib.sha256(data).hexdigest()
    name = known_files().get(sha256)
    base = os.path.basename(source)
    if name is not None:
        known = _known_encoding(name, sha256, ranks, base)
        if pattern is not None and pattern != known.pat_str:
            raise ConfigError(f"{source} is {name} by its sha256, which has its own split pattern; drop "
                              "--tiktoken-pattern")
        return known
    if pattern is not None:
        return TiktokenFile(base, sha256, ranks, pattern, {ENDOFTEXT: len(ranks)}, len(ranks),
                            f"{base} split by --tiktoken-pattern, EOS {ENDOFTEXT} = the number of ranks")
    if decode_only:
        return TiktokenFile(base, sha256, ranks, DECODE_ONLY_PATTERN, {ENDOFTEXT: len(ranks)}, len(ranks),
                            f"{base} read to decode only (its ranks; no split pattern needed)", encodes=False)
    raise ConfigError(f"{source}: not a published .tiktoken file (sha256 {sha256[:16]}..., not one of "
                      f"{', '.join(ENCODINGS)}), so its split pattern is not known: pass its split pattern with "
                      f"--tiktoken-pattern REGEX (its EOS is then {ENDOFTEXT} = the number of ranks, {len(ranks)})")


def tiktoken_spec(tokenizer: str, pattern: str | None) -> str:
    """The tokenizer spec of `--tokenizer tiktoken:PATH --tiktoken-pattern REGEX`: `tiktoken:PATH`, a NUL, the
    pattern. One string names the tokenizer wherever a spec goes (the run's settings, every worker); no path
    and no command-line argument can hold a NUL, so the two parts never mix."""
    if pattern is None:
        return tokenizer
    if not tokenizer.startswith("tiktoken:") or "\0" in tokenizer:
        raise ConfigError(f"--tiktoken-pattern applies to --tokenizer tiktoken:PATH (a .tiktoken file), not "
                          f"{tokenizer}")
    if "\0" in pattern or not pattern:
        raise ConfigError("--tiktoken-pattern: pass a non-empty regular expression without NUL characters")
    return f"{tokenizer}\0{pattern}"


def split_spec(spec: str) -> tuple[str, str | None]:
    """The two parts of a tokenizer spec that `tiktoken_spec` made: the spec without its pattern, the pattern."""
    spec, _, pattern = spec.partition("\0")
    return spec, pattern or None


def parse_ranks(data: bytes, source: str) -> dict[bytes, int]:
    """The ranks of a `.tiktoken` file, exactly 0..n-1 with every single byte ranked; else a ConfigError naming
    the first line at fault. Blank lines are skipped, as tiktoken's own loader does."""
    ranks: dict[bytes, int] = {}
    lines = data.splitlines()
    for number, line in enumerate(lines, 1):
        if not line:
            continue
        token, space, rank = line.partition(b" ")
        try:
            if not (space and token and rank.removeprefix(b"-").isdigit()):
                raise ValueError
            token = base64.b64decode(token, validate=True)
        except (ValueError, binascii.Error):
            raise _lie(source, f"line {number} is not 'BASE64TOKEN RANK' ({line[:60]!r})") from None
        if token in ranks:
            first = _line_of(lines, list(ranks).index(token))
            raise _lie(source, f"line {number}: token {token!r} is also on line {first}")
        ranks[token] = int(rank)
    if not ranks:
        raise ConfigError(f"{source}: empty .tiktoken file")
    values = list(ranks.values())
    if min(values) != 0 or max(values) != len(values) - 1 or len(set(values)) != len(values):
        raise _lie(source, _first_bad_rank(values, lines))
    missing = next((b for b in range(256) if bytes([b]) not in ranks), None)
    if missing is not None:
        raise _lie(source, f"byte 0x{missing:02x} has no rank (every single byte needs one: tiktoken fails on "
                           "text that holds a byte it cannot rank)")
    return ranks


def _line_of(lines: list[bytes], k: int) -> int:
    """The line number of the k-th token (blank lines hold none)."""
    return [number for number, line in enumerate(lines, 1) if line][k]


def _first_bad_rank(values: list[int], lines: list[bytes]) -> str:
    """Where ranks that are not exactly 0..n-1 first go wrong, in file order."""
    n = len(values)
    seen: dict[int, int] = {}
    for k, rank in enumerate(values):
        if rank < 0:
            return f"line {_line_of(lines, k)}: rank {rank} is negative"
        if rank >= n:
            gaps = set(range(n)) - set(values)
            return (f"line {_line_of(lines, k)}: rank {rank} is not below the number of ranks ({n}"
                    + (f"; rank {min(gaps)} is missing)" if gaps else ")"))
        if rank in seen:
            return f"line {_line_of(lines, k)}: rank {rank} is also the rank of line {_line_of(lines, seen[rank])}"
        seen[rank] = k
    raise AssertionError("unreachable: n distinct ranks in [0, n) are exactly 0..n-1")


def _lie(source: str, what: str) -> ConfigError:
    return ConfigError(f"{source}: not a valid .tiktoken file: {what}; a .tiktoken file ranks each token once, "
                       "0 to n-1 (the token ids), every single byte among them: this one is damaged, edited, or not a "
                       "tiktoken BPE")


@functools.lru_cache(maxsize=1)
def _published() -> dict[str, str]:
    """sha256 -> encoding of the files tiktoken's registry downloads (the hashes it checks them against), and
    Llama 3's. A tiktoken whose registry is laid out otherwise is not run (it might download): then only Llama 3."""
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext import openai_public

    if getattr(openai_public, "load_tiktoken_bpe", None) is not load_tiktoken_bpe:
        log.warning("%s is not laid out as expected: OpenAI's .tiktoken files are not recognised (pass "
                    "--tiktoken-pattern for them)", openai_public.__file__)
        return {LLAMA3_SHA256: LLAMA3}
    return {registry_file(name)[1]: name for name in OPENAI_ENCODINGS} | {LLAMA3_SHA256: LLAMA3}


def known_files() -> dict[str, str]:
    """sha256 -> encoding of every file read as a published encoding: the registry's, Llama 3's, EXTRA_KNOWN_FILES."""
    return _published() | EXTRA_KNOWN_FILES


class _Hash(Exception):
    """The file a registry constructor reads and the hash it expects it to have (raised where it would download
    the file)."""


def registry_file(name: str) -> tuple[str, str]:
    """(URL, sha256) of the file tiktoken's registry reads for the OpenAI encoding `name`; nothing is read."""
    blobpath, expected_hash = _registry(name, None)
    return blobpath, expected_hash


def _registry(name: str, ranks: dict[bytes, int] | None) -> Any:
    """What tiktoken's registry constructor for the OpenAI encoding `name` gives: its file's URL and expected
    sha256 (`ranks` None), or the encoding's dict with `ranks` as its file. The constructor runs as tiktoken wrote it,
    with its loader replaced so that nothing is downloaded, under the registry's own lock (held by
    `tiktoken.get_encoding` while it runs a constructor: no other thread meets the replaced loader)."""
    import tiktoken.registry
    from tiktoken.load import load_tiktoken_bpe
    from tiktoken_ext import openai_public

    def load(blobpath: str, expected_hash: str | None = None) -> dict[bytes, int]:
        if ranks is None:
            raise _Hash(blobpath, expected_hash)
        return ranks

    with getattr(tiktoken.registry, "_lock", None) or _REGISTRY_LOCK:
        openai_public.load_tiktoken_bpe = load
        try:
            return openai_public.ENCODING_CONSTRUCTORS[name]()
        except _Hash as e:
            return e.args
        finally:
            openai_public.load_tiktoken_bpe = load_tiktoken_bpe


def _known_encoding(name: str, sha256: str, ranks: dict[bytes, int], base: str) -> TiktokenFile:
    if name == LLAMA3:
        specials = {token: len(ranks) + i for i, token in enumerate(LLAMA3_SPECIALS)}
        return TiktokenFile(name, sha256, ranks, LLAMA3_PATTERN, specials, specials["<|end_of_text|>"],
                            f"{base} is {name} by its sha256: the split pattern and special tokens of Meta's Llama 3 "
                            f"tokenizer, EOS <|end_of_text|>")
    from tiktoken_ext import openai_public

    d = _registry(name, ranks)
    specials = dict(d["special_tokens"])
    return TiktokenFile(name, sha256, ranks, d["pat_str"], specials, specials[openai_public.ENDOFTEXT],
                        f"{base} is {name} by its sha256: its split pattern and special tokens from tiktoken's "
                        f"registry, EOS {openai_public.ENDOFTEXT}")


def tiktoken_encoding(f: TiktokenFile, user_pattern: str | None = None) -> "tiktoken.Encoding":
    """The tiktoken Encoding of a read file. A pattern of the user's (`user_pattern`) must compile and match
    every character of the probe text: tiktoken drops what the pattern leaves unmatched, silently."""
    from dataflow.tokenizers import bpe_convert, tiktoken_engine

    try:
        enc = tiktoken_engine.encoding(f.name, f.pat_str, f.ranks, f.special_tokens)
    except bpe_convert.NotConvertible as e:
        if user_pattern is None:
            raise
        raise ConfigError(f"--tiktoken-pattern {user_pattern!r}: tiktoken cannot use it ({e})") from None
    if user_pattern is not None:
        probe = bpe_convert.probe_texts()
        for i, (text, ids) in enumerate(zip(probe, tiktoken_engine.tiktoken_lists(enc, probe, 1))):
            back = enc.decode(ids)
            if back != text:
                raise ConfigError(f"--tiktoken-pattern {user_pattern!r} leaves text out: probe text {i} {text[:40]!r} "
                                  f"comes back as {back[:40]!r}; a split pattern must match every character")
    return enc
