"""`tokenizers` itself for a `tokenizer.json`: the reference every fast engine is proven against, and what the
manifest says about the tokenizer (vocabulary size, EOS).

Loading it costs about 0.3 s (parsing the JSON, listing the vocabulary). A run whose engine proof this machine
remembers needs it only to compare the engine on input text, so the metadata is remembered beside the proofs
(keyed by the file's sha256 and the `tokenizers` version) and the reference loads when first needed: after the
workers have started, in the process that checks. Whatever loads it compares the metadata it gives with the
remembered one (`HFTokenizer._reference_tokenizer`).
"""

from __future__ import annotations

import json
import os
from typing import Any

from dataflow.errors import ConfigError
from dataflow.formats.atomic import write_json_atomic
from dataflow.formats.manifest import TokenizerMeta
from dataflow.tokenizers import bpe_convert

EOS_NAMES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>", "<|im_end|>", "[SEP]")
# Ids below this pass however few the entries (tables of this many ids cost engines a few MB); beyond it the largest
# id must stay below twice the number of entries. Bump IDS_CHECKED when the rule changes: remembered metadata
# is of files that passed the rule of its version.
SPARSE_IDS_FREE = 1 << 17
IDS_CHECKED = 1
META_VERSION = 2  # 2: the post-processor's template is remembered too
CONFIG_NAME = "tokenizer_config.json"  # beside a tokenizer.json: the BOS and EOS the model's authors name


def load_reference(source: str, data: bytes, ids_checked: bool = False) -> Any:
    """`tokenizers.Tokenizer` for the file's bytes, set to encode special-token strings as plain text and never
    to truncate or pad; a ConfigError of one line for a file it cannot read. Its ids are checked first (`check_ids`)
    unless `ids_checked` (this machine remembers metadata of the file, which only a checked one has)."""
    from tokenizers import Tokenizer

    if not ids_checked:
        check_ids(data, source)
    try:
        tok = Tokenizer.from_str(data.decode("utf-8"))
    except Exception as e:  # the library raises plain Exception for malformed files
        raise ConfigError(f"{source}: not a valid Hugging Face tokenizer.json ({e})") from None
    tok.no_truncation()
    tok.no_padding()
    try:
        tok.encode_special_tokens = True  # "<|endoftext|>" in a document is plain text
    except AttributeError:
        raise ConfigError("the installed tokenizers library lacks encode_special_tokens; "
                          "install tokenizers>=0.15") from None
    return tok


def check_ids(data: bytes, source: str) -> None:
    """Refuse a `tokenizer.json` whose largest id, of its vocabulary or of an added token, lies far beyond its
    number of ids (see SPARSE_IDS_FREE): its vocabulary size would be that id + 1, and engines allocate per id
    (gigatoken tried 16 GB for an id of 10^9 and aborted). What is not JSON is left to `tokenizers` to refuse."""
    try:
        obj = json.loads(data)
    except ValueError:
        return
    if not isinstance(obj, dict):
        return
    vocab = obj["model"].get("vocab") if isinstance(obj.get("model"), dict) else None
    added = [t["id"] for t in obj.get("added_tokens") if isinstance(t, dict) and _is_id(t.get("id"))] \
        if isinstance(obj.get("added_tokens"), list) else []
    if isinstance(vocab, list):  # Unigram: the ids are the positions
        values = list(range(len(vocab)))
    else:
        values = list(vocab.values()) if isinstance(vocab, dict) else []
        if set(map(type, values)) - {int} or min(values, default=0) < 0:  # C loops: ~3 ms for 50K entries
            values = [v for v in values if _is_id(v)]
    largest = max(max(values, default=0), max(added, default=0))
    count = len(set(values).union(added)) if largest >= SPARSE_IDS_FREE else 0
    if largest >= max(2 * count, SPARSE_IDS_FREE):
        what, token = _holder(obj, vocab, largest)
        raise ConfigError(f"{source}: its largest id is {largest} but it has {count} ids (the {what} {token!r}); "
                          f"ids must lie below {SPARSE_IDS_FREE} or at most 2 ids per entry, since the vocabulary size "
                          "is the largest id + 1: the file is damaged or edited")


def _holder(obj: dict[str, Any], vocab: Any, largest: int) -> tuple[str, Any]:
    """What holds the id `largest`, for the message: a vocabulary token first, else an added token."""
    if isinstance(vocab, dict):
        for k, v in vocab.items():
            if v == largest and _is_id(v):
                return "vocabulary", k
    return "added token", next(t.get("content") for t in obj["added_tokens"]
                               if isinstance(t, dict) and t.get("id") == largest and _is_id(t["id"]))


def _is_id(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def meta_of(tok: Any, source: str, sha256: str) -> TokenizerMeta:
    """The manifest's tokenizer entry: ids up to the largest in the vocabulary (added tokens included), the EOS."""
    vocab = tok.get_vocab(with_added_tokens=True)
    return TokenizerMeta(kind="hf", name=_name(source), vocab_size=max(vocab.values(), default=-1) + 1,
                         eos_id=_find_eos(vocab, source), sha256=sha256)


def template_of(tok: Any) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The ids the file's post-processor puts before and after a single sequence (Llama-3: BOS before; GPT-2:
    none), as `tokenizers` itself applies it to an encoded text."""
    bare = tok.encode("a", add_special_tokens=False)
    full = tok.post_process(bare, None, True)
    ids, mask = full.ids, full.special_tokens_mask
    before = next((i for i, m in enumerate(mask) if not m), len(ids))
    after = before + len(bare.ids)
    return tuple(ids[:before]), tuple(ids[after:])


def config_tokens(source: str) -> dict[str, str]:
    """`bos_token` and `eos_token` of the tokenizer_config.json beside the tokenizer file (a string, or an
    added-token object with `content`); none when there is no such file. One ConfigError line for one that is
    not JSON."""
    import fsspec

    path = source.rsplit("/", 1)[0] + "/" + CONFIG_NAME if "/" in source else CONFIG_NAME
    try:
        with fsspec.open(path, "rb") as f:
            raw = f.read()
    except (OSError, ValueError):  # none there (or no such folder): the tokenizer.json alone says
        return {}
    try:
        d = json.loads(raw)
    except ValueError as e:
        raise ConfigError(f"{path}: not JSON ({e}); fix or remove it (it names the tokenizer's BOS and EOS), "
                          "or pass --bos-token/--eos-token") from None
    found = {}
    for key in ("bos_token", "eos_token"):
        value = d.get(key) if isinstance(d, dict) else None
        value = value.get("content") if isinstance(value, dict) else value
        if isinstance(value, str) and value:
            found[key] = value
    return found


def special_strings(data: bytes) -> list[str]:
    """The strings of a tokenizer.json's special added tokens, longest first."""
    obj = json.loads(data)
    found = {t["content"] for t in obj.get("added_tokens") or [] if isinstance(t, dict) and t.get("special")
             and isinstance(t.get("content"), str)}
    return sorted(found, key=lambda t: (-len(t), t))


def recall_meta(source: str, sha256: str) -> tuple[TokenizerMeta, tuple[tuple[int, ...], tuple[int, ...]]] | None:
    """The entry `meta_of` and the template `template_of` gave for this file on this machine before, if they
    were remembered."""
    try:
        with open(_meta_path(sha256)) as f:
            d = json.load(f)
        vocab_size, eos_id = d["vocab_size"], d["eos_id"]
        template = tuple(tuple(int(i) for i in part) for part in d.get("template", [[], []]))
    except (OSError, ValueError, KeyError, TypeError, ImportError):
        return None
    if not (type(vocab_size) is int and type(eos_id) is int and 0 <= eos_id < vocab_size and len(template) == 2):
        return None
    return (TokenizerMeta(kind="hf", name=_name(source), vocab_size=vocab_size, eos_id=eos_id, sha256=sha256),
            template)


def remember_meta(meta: TokenizerMeta, template: tuple[tuple[int, ...], tuple[int, ...]]) -> None:
    """Best effort: a read-only home only means the next run loads the reference before its workers start."""
    try:
        path = _meta_path(meta.sha256 or "")
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json_atomic(path, {"sha256": meta.sha256, "vocab_size": meta.vocab_size, "eos_id": meta.eos_id,
                                 "template": [list(part) for part in template]})
    except (OSError, ImportError):
        pass


def _meta_path(sha256: str) -> str:
    import tokenizers

    return os.path.join(bpe_convert.proof_cache_dir(),
                        f"{sha256}-ids{IDS_CHECKED}-meta{META_VERSION}-tokenizers{tokenizers.__version__}.meta.json")


def _name(source: str) -> str:
    return os.path.basename(source.rstrip("/"))


def _find_eos(vocab: dict[str, int], source: str) -> int:
    for name in EOS_NAMES:
        if name in vocab:
            return int(vocab[name])
    raise ConfigError(f"{source}: the tokenizer has no end-of-text token ({', '.join(EOS_NAMES)}); "
                      "use a tokenizer that defines one")
