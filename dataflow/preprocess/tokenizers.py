"""Tokenizers behind one small interface: `encode_batch(texts) -> list[np.ndarray]`, `decode(ids)`.

`bytes` is built in (UTF-8 bytes as ids 0-255, EOS 256). A Hugging Face `tokenizer.json` gives the ids
the `tokenizers` library gives; when it is a byte-level BPE that tiktoken can run exactly (GPT-2,
Llama-3 and Qwen-style files without a normalizer), tiktoken encodes it, several times faster, once
the two engines are proven to agree (see `bpe_convert`). `tiktoken:PATH` loads a `.tiktoken` BPE file.
Special-token strings inside a document are always encoded as ordinary text: a document never
injects an EOS. Lone surrogates (invalid Unicode) are encoded as U+FFFD by every engine.
"""

from __future__ import annotations

import abc
import array
import base64
import contextlib
import hashlib
import logging
import os
import shutil
import threading
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import fsspec
import numpy as np

from dataflow.errors import ConfigError, FormatError
from dataflow.formats.manifest import TokenizerMeta
from dataflow.preprocess import bpe_convert
from dataflow.preprocess.bpe_convert import NotConvertible

if TYPE_CHECKING:
    import tiktoken

log = logging.getLogger(__name__)

ENGINES = ("auto", "hf", "tiktoken")
# Input text each process compares against `tokenizers` before it trusts tiktoken alone (~0.1 s).
SAMPLE_CHARS = 1 << 17
EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>", "[SEP]")

# tokenizer.json sha256 -> (tiktoken Encoding, what its proof covered) or (None, why there is none)
_PROVEN: dict[str, tuple[tiktoken.Encoding | None, str]] = {}


# Python ints -> uint32 array: array.array converts a list about 3x faster than np.array does, and
# np.frombuffer wraps its buffer without a copy. This is the only per-token work the wrappers add.
_U32 = "I" if array.array("I").itemsize == 4 else "L"


def _to_arrays(id_lists: Sequence[list[int]]) -> list[np.ndarray]:
    """Each list of ids as a uint32 array."""
    frombuffer, typed, u32, code = np.frombuffer, array.array, np.uint32, _U32
    return [frombuffer(typed(code, ids), dtype=u32) for ids in id_lists]


def _scrub(text: str) -> str:
    """The text with lone surrogates replaced by U+FFFD, as tiktoken does; other text unchanged."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


_ENV_LOCK = threading.Lock()


@contextlib.contextmanager
def _sequential_tokenizers() -> Iterator[None]:
    """`tokenizers` batch calls on the calling thread only, for the duration of the block.

    The library reads TOKENIZERS_PARALLELISM at every batch call; setting it for the call alone keeps
    one engine thread without changing the process for other users, and never starts rayon's pool
    (whose threads a forked worker would inherit broken).
    """
    with _ENV_LOCK:
        old = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            yield
        finally:
            if old is None:
                del os.environ["TOKENIZERS_PARALLELISM"]
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = old


class Tokenizer(abc.ABC):
    """A loaded tokenizer: its manifest metadata, the file it came from, and encode/decode."""

    meta: TokenizerMeta
    source: str | None = None  # the tokenizer file (local path or URL); None for `bytes`
    engine: str = "bytes"  # "bytes" | "hf" | "tiktoken": what encode_batch runs on
    engine_reason: str = ""  # why that engine, for the log
    threads: int = 1  # engine threads per encode_batch call

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of each text, special-token strings treated as plain text, no EOS added."""

    @abc.abstractmethod
    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text of the ids, EOS dropped."""

    def copy_into(self, out_dir: str) -> TokenizerMeta:
        """Copy the tokenizer file into the dataset folder so readers need nothing else."""
        if self.source is None:
            return self.meta
        name = "tokenizer.json" if self.meta.kind == "hf" else "tokenizer.tiktoken"
        with fsspec.open(self.source, "rb") as src, open(os.path.join(out_dir, name), "wb") as dst:
            shutil.copyfileobj(src, dst)
        self.meta.file = name
        return self.meta


class ByteTokenizer(Tokenizer):
    """UTF-8 bytes as token ids; decode(encode(text)) is the exact text."""

    def __init__(self) -> None:
        self.meta = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
        self.engine_reason = "bytes: the built-in UTF-8 byte tokenizer"

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        try:
            return [np.frombuffer(t.encode("utf-8"), dtype=np.uint8) for t in texts]
        except UnicodeEncodeError:
            return [np.frombuffer(_scrub(t).encode("utf-8"), dtype=np.uint8) for t in texts]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = np.asarray(ids)
        return arr[arr < 256].astype(np.uint8).tobytes().decode("utf-8", errors="replace")


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizer.json`: ids are those of `tokenizers` with `encode_special_tokens=True`.

    With engine "auto" the file is converted for tiktoken and the two engines are compared id for id
    on the probe text, on every vocab token (unless ignore_merges makes whole-piece lookups identical
    by construction), on `sample`, and on the first SAMPLE_CHARS of text this object encodes; any
    difference, or a feature tiktoken cannot reproduce, leaves `tokenizers` in charge and says why in
    `engine_reason`. Engine "tiktoken" turns those reasons into a ConfigError; "hf" skips the proof.
    """

    def __init__(self, source: str, data: bytes, engine: str = "auto", threads: int = 1,
                 sample: Sequence[str] = ()) -> None:
        from tokenizers import Tokenizer as _HF

        try:
            self._tok = _HF.from_str(data.decode("utf-8"))
        except Exception as e:  # the library raises plain Exception for malformed files
            raise ConfigError(f"{source}: not a valid Hugging Face tokenizer.json ({e})") from None
        self._tok.no_truncation()
        self._tok.no_padding()
        try:
            self._tok.encode_special_tokens = True  # "<|endoftext|>" in a document is plain text
        except AttributeError:
            raise ConfigError("the installed tokenizers library lacks encode_special_tokens; "
                              "install tokenizers>=0.15") from None
        self.source = source
        self.threads = threads
        self._requested = engine
        self._sha256 = hashlib.sha256(data).hexdigest()
        vocab = self._tok.get_vocab(with_added_tokens=True)
        self.meta = TokenizerMeta(kind="hf", name=os.path.basename(source.rstrip("/")),
                                  vocab_size=max(vocab.values(), default=-1) + 1, eos_id=_find_eos(vocab, source),
                                  sha256=self._sha256)
        if threads > 1:  # rayon sizes its pool once per process, at its first parallel call
            os.environ.setdefault("RAYON_NUM_THREADS", str(threads))
        self._enc = None  # the tiktoken Encoding when tiktoken runs
        self._sample_left = 0
        self.engine, self.engine_reason = "hf", "hf: chosen with --engine hf"
        if engine != "hf":
            self._try_tiktoken(data, list(sample))

    # --- engine choice ---------------------------------------------------------------------------

    def _try_tiktoken(self, data: bytes, sample: list[str]) -> None:
        try:
            enc, proof = self._convert_and_prove(data)
            why = bpe_convert.first_mismatch(self._reference, _lists(enc), [_scrub(t) for t in sample],
                                             "input sample")
            if why:
                raise NotConvertible(why)
        except NotConvertible as e:
            if self._requested == "tiktoken":
                raise ConfigError(f"{self.source}: --engine tiktoken cannot give this tokenizer's ids: {e}") from None
            self.engine_reason = f"hf: {e}"
            log.info("%s: tokenizers encodes (%s)", self.source, e)
            return
        self._enc = enc
        self._sample_left = SAMPLE_CHARS
        self.engine = "tiktoken"
        self.engine_reason = (f"tiktoken: {proof}" + (f" + {len(sample)} sample texts" if sample else "")
                              + f"; each process also checks its first {SAMPLE_CHARS} characters")
        log.info("%s: %s", self.source, self.engine_reason)

    def _convert_and_prove(self, data: bytes) -> tuple[tiktoken.Encoding, str]:
        """The tiktoken Encoding and what its proof covered; NotConvertible saying why there is none.

        Both outcomes are kept per file and process: the proof runs once however often the file loads.
        """
        if self._sha256 not in _PROVEN:
            try:
                _PROVEN[self._sha256] = self._proven_before() or self._build_and_prove(data)
            except NotConvertible as e:
                _PROVEN[self._sha256] = (None, str(e))
        enc, text = _PROVEN[self._sha256]
        if enc is None:
            raise NotConvertible(text)
        return enc, text

    def _proven_before(self) -> tuple[tiktoken.Encoding, str] | None:
        """The Encoding from the ranks remembered with an earlier proof of the same file on this machine
        (same conversion and library versions): no conversion, no comparisons. The per-process check
        of real input still runs."""
        recalled = bpe_convert.recall_proof(self._sha256)
        if recalled is None:
            return None
        enc = self._encoding(recalled.pat_str, recalled.mergeable_ranks, recalled.special_tokens)
        return enc, recalled.proof + " (proof cached on this machine)"

    def _encoding(self, pat_str: str, ranks: dict[bytes, int], specials: dict[str, int]) -> tiktoken.Encoding:
        import tiktoken

        try:
            return tiktoken.Encoding(f"dataflow-{self._sha256[:12]}", pat_str=pat_str, mergeable_ranks=ranks,
                                     special_tokens=specials)
        except Exception as e:  # a regex the tiktoken engine cannot compile, mostly
            raise NotConvertible(f"tiktoken rejects the conversion ({e})") from None

    def _build_and_prove(self, data: bytes) -> tuple[tiktoken.Encoding, str]:
        """Convert, build the Encoding and compare it with tokenizers on the probe (and the vocab)."""
        try:
            obj = bpe_convert.parse_tokenizer_json(data)
        except ValueError as e:
            raise NotConvertible(f"cannot parse the JSON ({e})") from None
        conv = bpe_convert.convert(obj)
        enc = self._encoding(conv.pat_str, conv.mergeable_ranks, conv.special_tokens)
        specials = [t["content"] for t in obj.get("added_tokens") or []]
        probe = bpe_convert.probe_texts(specials)
        # Without ignore_merges, tokenizers runs BPE on a piece that is itself a token, where tiktoken
        # looks it up whole: the two agree on such pieces only if BPE rebuilds every token.
        vocab_texts = [] if conv.ignore_merges else bpe_convert.vocab_texts(conv.mergeable_ranks)
        why = (bpe_convert.first_mismatch(self._reference, _lists(enc), probe, "probe")
               or bpe_convert.first_mismatch(self._reference, _lists(enc), vocab_texts, "vocab token"))
        if why:
            raise NotConvertible(why)
        left_out = f"; {len(conv.skipped)} vocab tokens no merge can make left out" if conv.skipped else ""
        proof = (f"ranks and split pattern ({conv.pattern_source}) derived from tokenizer.json{left_out}, "
                 f"equivalence proven on the probe ({len(probe)} texts)"
                 + (f" + all {len(vocab_texts)} vocab tokens" if vocab_texts else ""))
        bpe_convert.remember_proof(self._sha256, proof, conv)
        return enc, proof

    def _check_sample(self, texts: list[str], got: list[np.ndarray]) -> list[np.ndarray]:
        """Compare the first SAMPLE_CHARS characters this process encodes; on a difference, use tokenizers."""
        checked, results = [], []
        for text, ids in zip(texts, got):
            if self._sample_left <= 0:
                break
            if len(text) > self._sample_left:
                text = text[:self._sample_left]
                ids = _to_arrays([self._enc.encode_ordinary(text)])[0]
            self._sample_left -= len(text)
            checked.append(_scrub(text))
            results.append(ids)
        why = bpe_convert.first_mismatch(self._reference, lambda _: [r.tolist() for r in results], checked, "input")
        if why is None:
            return got
        if self._requested == "tiktoken":
            raise ConfigError(f"{self.source}: --engine tiktoken gives other ids than tokenizers: {why}")
        log.warning("%s: tiktoken and tokenizers disagree (%s); tokenizers encodes from here on", self.source, why)
        self._enc, self.engine, self.engine_reason = None, "hf", f"hf: {why}"
        return self._encode_hf(texts)

    # --- encode / decode -------------------------------------------------------------------------

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        texts = texts if isinstance(texts, list) else list(texts)
        if self._enc is None:
            return self._encode_hf(texts)
        out = _to_arrays(_tiktoken_lists(self._enc, texts, self.threads))
        if self._sample_left > 0:
            out = self._check_sample(texts, out)
        return out

    def _encode_hf(self, texts: list[str]) -> list[np.ndarray]:
        return _to_arrays(self._hf_lists(texts, self.threads))

    def _reference(self, texts: list[str]) -> list[list[int]]:
        """The ids the proofs compare against, on this thread: checks never start rayon's pool."""
        return self._hf_lists(texts, 1)

    def _hf_lists(self, texts: list[str], threads: int) -> list[list[int]]:
        try:
            if threads == 1:
                with _sequential_tokenizers():
                    encs = self._tok.encode_batch(texts, add_special_tokens=False)
            else:  # parallel unless TOKENIZERS_PARALLELISM says otherwise (as after a fork)
                encs = self._tok.encode_batch(texts, add_special_tokens=False)
        except TypeError:  # a lone surrogate: not a Rust string
            return self._hf_lists([_scrub(t) for t in texts], threads)
        return [e.ids for e in encs]

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = np.asarray(ids)
        return self._tok.decode(arr[arr != self.meta.eos_id].tolist(), skip_special_tokens=False)


def _tiktoken_lists(enc: tiktoken.Encoding, texts: Sequence[str], threads: int) -> list[list[int]]:
    """tiktoken's ordinary encoding (special-token strings as text) of each text.

    One thread: `encode_ordinary` on the calling thread, as `encode_ordinary_batch(num_threads=1)`
    does minus its per-call thread pool and per-text hand-off (measurably slower). More threads:
    `encode_ordinary_batch`. Lone surrogates become U+FFFD inside tiktoken.
    """
    if threads == 1:
        encode = enc.encode_ordinary
        return [encode(t) for t in texts]
    return enc.encode_ordinary_batch(list(texts), num_threads=threads)


def _lists(enc: tiktoken.Encoding) -> Callable[[list[str]], list[list[int]]]:
    """tiktoken's ids as lists, one engine thread: the side of the proof under test."""
    return lambda texts: _tiktoken_lists(enc, texts, 1)


def _find_eos(vocab: dict[str, int], source: str) -> int:
    for name in EOS_NAMES:
        if name in vocab:
            return int(vocab[name])
    raise ConfigError(f"{source}: the tokenizer has no end-of-text token ({', '.join(EOS_NAMES)}); "
                      "use a tokenizer that defines one")


class TiktokenTokenizer(Tokenizer):
    """A `.tiktoken` BPE file (base64 token, rank per line).

    The file holds ranks only, so this assumes GPT-2's conventions: GPT-2's split pattern and one
    special token, `<|endoftext|>` = the number of ranks, which is also EOS. For other encodings use
    their `tokenizer.json` (the auto engine still runs it on tiktoken when it is exact).
    """

    GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""

    def __init__(self, source: str, data: bytes, threads: int = 1) -> None:
        import tiktoken

        try:
            ranks = {base64.b64decode(tok, validate=True): int(rank)
                     for tok, rank in (line.split() for line in data.decode().splitlines() if line)}
        except (ValueError, UnicodeDecodeError) as e:
            raise ConfigError(f"{source}: not a valid .tiktoken file: each line must be 'base64-token rank' ({e})") \
                from None
        if not ranks:
            raise ConfigError(f"{source}: empty .tiktoken file")
        eos = len(ranks)
        self._enc = tiktoken.Encoding(name=os.path.basename(source), pat_str=self.GPT2_PATTERN,
                                      mergeable_ranks=ranks, special_tokens={"<|endoftext|>": eos})
        self.source = source
        self.threads = threads
        self.engine = "tiktoken"
        self.engine_reason = "tiktoken: a .tiktoken file (GPT-2 split pattern, EOS = number of ranks)"
        self.meta = TokenizerMeta(kind="tiktoken", name=os.path.basename(source), vocab_size=eos + 1,
                                  eos_id=eos, sha256=hashlib.sha256(data).hexdigest())

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        return _to_arrays(_tiktoken_lists(self._enc, texts, self.threads))

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        arr = np.asarray(ids)
        return self._enc.decode(arr[arr != self.meta.eos_id].tolist())


def load_tokenizer(spec: str, engine: str = "auto", *, threads: int = 1, sample: Sequence[str] = ()) -> Tokenizer:
    """`bytes`, a path/URL to a `tokenizer.json`, or `tiktoken:PATH`.

    `engine` ("auto", "hf", "tiktoken") picks what encodes a `tokenizer.json`; see HFTokenizer.
    `threads` is the number of engine threads per encode_batch call (one per worker process by default).
    `sample` is input text added to the equivalence proof of the auto/tiktoken engine.
    """
    if engine not in ENGINES + ("bytes",):
        raise ConfigError(f"unknown engine {engine!r}; choose auto, hf or tiktoken")
    if not isinstance(threads, int) or threads < 1:
        raise ConfigError(f"tokenizer threads must be a positive integer, got {threads!r}")
    if spec == "bytes":
        if engine not in ("auto", "bytes"):
            raise ConfigError(f"--engine {engine} applies to tokenizer.json files; the bytes tokenizer has no engine")
        return ByteTokenizer()
    if engine == "bytes":
        raise ConfigError(f"engine 'bytes' applies only to the bytes tokenizer, not {spec}")
    kind = "tiktoken" if spec.startswith("tiktoken:") else "hf"
    source = spec[len("tiktoken:"):] if kind == "tiktoken" else spec
    if kind == "tiktoken" and engine == "hf":
        raise ConfigError(f"{source}: a .tiktoken file runs only on tiktoken; --engine hf needs a tokenizer.json")
    try:
        with fsspec.open(source, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise ConfigError(f"tokenizer file not found: {source}") from None
    except IsADirectoryError:
        raise ConfigError(f"{source} is a folder; pass the tokenizer.json (or tiktoken:FILE) inside it") from None
    if kind == "tiktoken":
        return TiktokenTokenizer(source, data, threads=threads)
    return HFTokenizer(source, data, engine=engine, threads=threads, sample=sample)


def tokenizer_for_dataset(dataset_dir: str, meta: TokenizerMeta) -> Tokenizer:
    """The tokenizer a dataset was written with, from the copy inside its folder (for decoding)."""
    if meta.kind == "bytes":
        return ByteTokenizer()
    if not meta.file:
        raise FormatError(f"{dataset_dir}: the manifest names no tokenizer file copy; cannot decode")
    path = os.path.join(dataset_dir, meta.file)
    if meta.kind == "tiktoken":
        return load_tokenizer("tiktoken:" + path, engine="tiktoken")
    return load_tokenizer(path, engine="hf")  # decoding always runs on tokenizers: no proof needed
