"""Small `.tiktoken` files made from GPT-2's ranks, texts that tell split patterns apart, and tiktoken's own
registry of published encodings."""

from __future__ import annotations

import base64
import pathlib

from tiktoken_ext import openai_public

from support.data import GPT2_TIKTOKEN


GPT2_LINES = GPT2_TIKTOKEN.read_bytes().splitlines()


TEXTS = ["In the beginning God created the heaven and the earth. 12345 and 67890!",
         "I'M sure it's THE one's: don't\n\n\n  spaces   \t tabs and 1,000,000 numbers 3.14159",
         "Ünïcödé, 中文文本, emoji 😀👍🏽 and <|endoftext|> as text", "x" * 300 + " " * 40 + "\r\n" * 5]


# merges after the 256 single bytes: digits (which cl100k-style patterns split in threes), words, contractions
MERGES = [b"12", b"123", b"45", b"12345", b"67", b"678", b"90", b"67890", b"th", b"the", b" the", b"an", b"and",
          b" and", b"'s", b"'S", b"in", b" in", b"  ", b"    ", b"\n\n", b"xx", b"xxxx", b"00", b"000"]


def small_ranks() -> dict[bytes, int]:
    """A tiny valid .tiktoken vocabulary: the 256 single bytes (GPT-2's order), then MERGES."""
    tokens = [base64.b64decode(line.split()[0]) for line in GPT2_LINES[:256]] + MERGES
    return {t: i for i, t in enumerate(tokens)}


def write_tiktoken(path: pathlib.Path, lines: list[bytes]) -> pathlib.Path:
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    return path


def rank_lines(ranks: dict[bytes, int]) -> list[bytes]:
    return [base64.b64encode(t) + b" " + str(r).encode() for t, r in ranks.items()]


def registry(name: str, ranks: dict[bytes, int]) -> dict:
    """What tiktoken's own registry constructor for `name` gives, with `ranks` as the file it would download."""
    saved = openai_public.load_tiktoken_bpe
    openai_public.load_tiktoken_bpe = lambda *args, **kwargs: ranks
    try:
        return openai_public.ENCODING_CONSTRUCTORS[name]()
    finally:
        openai_public.load_tiktoken_bpe = saved
