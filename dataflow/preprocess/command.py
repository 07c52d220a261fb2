"""`dataflow tokenize` on the command line: its arguments, and the run they describe with its summary.

The arguments are `TokenizeConfig`'s fields, each spelled as its `setting` says (flag, help, argparse's
options); two flags are the command line's own: `--tiktoken-pattern` (it travels in the tokenizer's spec)
and `--json`."""

from __future__ import annotations

import argparse
import dataclasses
import json
from typing import Callable

from dataflow.preprocess.config import TokenizeConfig
from dataflow.sizes import count


def add_tokenize_parser(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`dataflow tokenize`'s arguments: one per setting of `TokenizeConfig`, in its order."""
    t = add("tokenize", "tokenize raw text into compressed shards")
    dests = {}
    for f in dataclasses.fields(TokenizeConfig):
        options = {"default": f.default, **f.metadata["argparse"]} if f.default is not dataclasses.MISSING \
            and f.metadata["from_arg"] is None else dict(f.metadata["argparse"])
        dests[f.name] = t.add_argument(*f.metadata["flag"], help=f.metadata["help"], **options).dest
        if f.name == "engine":
            t.add_argument("--tiktoken-pattern", default=None, metavar="REGEX", help="the split pattern of a "
                           "tiktoken:PATH file that is not a published one (r50k_base, p50k_base, cl100k_base, "
                           "o200k_base and Llama 3's are known by sha256 and need none); its EOS is then "
                           "<|endoftext|> = the number of ranks")
    t.add_argument("--json", action="store_true", help="print the summary as JSON")
    t.set_defaults(func=run_command, setting_dests=dests)


def config_of(args: argparse.Namespace) -> TokenizeConfig:
    """The settings the arguments give (the tiktoken pattern joined to the tokenizer's spec)."""
    from dataflow.tokenizers.tiktoken_files import tiktoken_spec

    values = {}
    for f in dataclasses.fields(TokenizeConfig):
        value = getattr(args, args.setting_dests[f.name])
        values[f.name] = value if f.metadata["from_arg"] is None else f.metadata["from_arg"](value)
    values["tokenizer"] = tiktoken_spec(values["tokenizer"], args.tiktoken_pattern)  # the pattern travels in the spec
    return TokenizeConfig(**values)


def run_command(args: argparse.Namespace) -> int:
    """Tokenize as the arguments say; print the summary (as JSON with --json)."""
    from dataflow.preprocess.run import tokenize

    summary = tokenize(config_of(args)).to_dict()
    if args.json:
        print(json.dumps(summary, indent=1))
    else:
        print(f"tokenized {count(summary['documents'], 'document')} into {count(summary['tokens'], 'token')} "
              f"in {summary['seconds']:.1f} s ({summary['mb_per_s']} MB/s of text, "
              f"{summary['tokens_per_s']:,} tokens/s; tokenizer {summary['tokenizer']}, engine {summary['engine']})")
        if summary["engine_reason"]:
            print(f"  engine: {summary['engine_reason']}")
        for split, d in summary["datasets"].items():
            print(f"  {split}: {count(d['documents'], 'document')}, {count(d['tokens'], 'token')}, "
                  f"{count(d['shards'], 'shard')}, "
                  f"{d['bytes'] / 1e6:.1f} MB")
        if summary["resumed_from_unit"]:
            print(f"  resumed at unit {summary['resumed_from_unit']} of {summary['units']}")
        for note in summary["notes"]:
            print(f"  {note}")
        if summary["errors"]:
            print(f"  skipped {summary['errors']} bad records, listed in {args.out}/_errors*.jsonl")
        print(f"  output: {args.out}")
    return 0
