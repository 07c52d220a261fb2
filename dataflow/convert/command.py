"""`dataflow convert`: Megatron's .bin/.idx and nanoGPT's flat .bin, into a dataset and back out.

`add_convert_parser(sub)` registers the subcommand on the `dataflow` parser; nothing heavy is imported
until the command runs. Errors are `DataflowError`s: the `dataflow` command prints them as one line.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from dataflow.errors import ConfigError

EPILOG = """examples:
  dataflow convert --from megatron corpus_text_document -o data/train --tokenizer tokenizer.json
  dataflow convert --from nanogpt train.bin -o data/train --tokenizer gpt2/tokenizer.json
  dataflow convert --to megatron data/train -o megatron/corpus_text_document
  dataflow convert --to nanogpt data/train -o train.bin"""


def add_convert_parser(sub: Any) -> argparse.ArgumentParser:
    """Add `convert` to the subparsers `sub` of the `dataflow` command."""
    p = sub.add_parser("convert", help="Megatron .bin/.idx and nanoGPT .bin into a dataset, and back out",
                       description="Convert token files into a dataset (--from) or a dataset into token files "
                                   "(--to): the same documents in the same order.", epilog=EPILOG,
                       formatter_class=lambda prog: argparse.RawDescriptionHelpFormatter(prog, width=110))
    way = p.add_mutually_exclusive_group(required=True)
    way.add_argument("--from", dest="src", choices=["megatron", "nanogpt"],
                     help="read INPUTs of this kind (Megatron PREFIXes of PREFIX.bin/.idx, or nanoGPT .bin files) "
                          "into the dataset -o")
    way.add_argument("--to", dest="dst", choices=["megatron", "nanogpt"],
                     help="write the dataset INPUTs as -o (a Megatron PREFIX, or a nanoGPT .bin file)")
    p.add_argument("inputs", nargs="+", help="--from: Megatron prefixes or nanoGPT files; --to: dataset folders; "
                   "several are read in the order given")
    p.add_argument("-o", "--out", required=True, help="--from: the dataset folder; --to megatron: the PREFIX of "
                   "PREFIX.bin/.idx; --to nanogpt: the .bin file; a local path or a URL (s3://, gs://, ...: staged "
                   "in $DATAFLOW_CACHE, uploaded when whole)")
    p.add_argument("--tokenizer", help="--from: the tokenizer the ids come from, as `dataflow tokenize` takes it: "
                   "bytes | PATH/URL to tokenizer.json | tiktoken:PATH (required with --from)")
    p.add_argument("--dtype", choices=["uint16", "uint32"], help="nanoGPT token type (default: uint16, as "
                   "nanoGPT's train.py reads; uint32 needs a file named for it, e.g. train.uint32.bin)")
    p.add_argument("--eos-id", type=int, help="nanoGPT: --from splits documents after this id (default: the "
                   "tokenizer's EOS); --to puts it after each document (for a dataset tokenized with --no-eos)")
    p.add_argument("--format", default="arrow", choices=["arrow", "tar"], help="--from: shard format "
                   "(default: arrow)")
    p.add_argument("--compression", default="zstd", choices=["zstd", "none"], help="--from: shard compression "
                   "(default: zstd)")
    p.add_argument("--shard-size", default="128MB", help="--from: token bytes per shard (default: 128MB)")
    p.add_argument("--overwrite", action="store_true", help="replace an output that exists")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                   help="show full tracebacks (also DATAFLOW_DEBUG=1)")
    p.set_defaults(func=cmd_convert)
    return p


def _check_flags(args: argparse.Namespace) -> None:
    """Flags that mean nothing in this direction are mistakes, not silently ignored."""
    if args.src:
        if not args.tokenizer:
            raise ConfigError("--from needs --tokenizer: the tokenizer the ids were made with (bytes, a "
                              "tokenizer.json or tiktoken:PATH); the dataset keeps it for decoding")
    elif args.tokenizer:
        raise ConfigError("--to uses the dataset's own tokenizer; drop --tokenizer")
    kind = args.src or args.dst
    if kind == "megatron" and (args.dtype or args.eos_id is not None):
        raise ConfigError("--dtype and --eos-id apply to nanoGPT files; Megatron's index has its own dtype and "
                          "document boundaries")
    if args.dst and (args.format, args.compression, args.shard_size) != ("arrow", "zstd", "128MB"):
        raise ConfigError("--format, --compression and --shard-size apply to --from (the dataset written)")
    named = [_input_identity(kind if args.src else "dataset", x) for x in args.inputs]
    for k, identity in enumerate(named):
        if identity in named[:k]:  # its documents would be converted twice
            first = args.inputs[named.index(identity)]
            raise ConfigError(f"{args.inputs[k]}: the same input as {first}; name each input once")
    folder = args.out.endswith(("/", os.sep)) or os.path.isdir(args.out.removeprefix("file://"))
    if args.dst == "megatron" and folder:
        raise ConfigError(f"-o {args.out}: --to megatron takes a prefix (PREFIX.bin and PREFIX.idx are written), "
                          f"not a folder; e.g. -o {os.path.join(args.out, 'data_text_document')}")


def _input_identity(kind: str, path: str) -> str:
    """What an input names, whatever its spelling: a dataset's folder, a Megatron prefix, a nanoGPT file."""
    path = path.removeprefix("file://")
    if "://" in path:
        return path.rstrip("/")
    if kind == "megatron":
        from dataflow.convert.megatron import strip_suffix

        path = strip_suffix(path)
    elif kind == "dataset" and os.path.basename(path) == "index.json":
        path = os.path.dirname(path) or "."
    return os.path.realpath(path)


class _Bar:
    """A tqdm bar on stderr, opened once the inputs are checked (a mistake prints its line alone)."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar = enabled, None

    def start(self, total: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, unit="tok", unit_scale=True, desc="convert", disable=not self.enabled,
                        dynamic_ncols=True, file=sys.stderr)

    def update(self, n: int) -> None:
        self.bar.update(n)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def cmd_convert(args: argparse.Namespace) -> int:
    from dataflow.convert import run
    from dataflow.convert.outputs import write_error

    _check_flags(args)
    bar = _Bar(not args.no_progress)
    try:
        summary = _convert(args, run, bar)
    except OSError as e:  # -o under a file, in /proc, a folder where a file goes, a full disk: one line
        known = write_error(e, args.out)
        if known is None:
            raise
        raise known from None
    finally:
        bar.close()
    where = (f"{summary.shards} shard{'' if summary.shards == 1 else 's'} in {args.out}" if args.src
             else " and ".join(summary.outputs))
    print(f"converted {summary.documents:,} documents, {summary.tokens:,} {summary.dtype} tokens from "
          f"{len(args.inputs)} {'input' if len(args.inputs) == 1 else 'inputs'} into {where}")
    for note in summary.notes:
        print(f"  {note}")
    return 0


def _convert(args: argparse.Namespace, run: Any, bar: _Bar) -> Any:
    """The conversion the flags ask for: its summary."""
    if args.src:
        options = run.WriteOptions(args.format, args.compression, args.shard_size, args.overwrite)
        if args.src == "megatron":
            return run.from_megatron(args.inputs, args.out, args.tokenizer, options, bar)
        return run.from_nanogpt(args.inputs, args.out, args.tokenizer, options, bar, args.dtype, args.eos_id)
    if args.dst == "megatron":
        return run.to_megatron(args.inputs, args.out, args.overwrite, bar)
    return run.to_nanogpt(args.inputs, args.out, args.overwrite, bar, args.dtype, args.eos_id)
