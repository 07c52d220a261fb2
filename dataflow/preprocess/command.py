"""`dataflow tokenize` on the command line: its arguments, and the run they describe with its summary."""

from __future__ import annotations

import argparse
import json
from typing import Callable

from dataflow.units import count


def add_tokenize_parser(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`dataflow tokenize`'s arguments."""
    t = add("tokenize", "tokenize raw text into compressed shards")
    t.add_argument("inputs", nargs="+", help="files, globs, folders or fsspec URLs: .jsonl/.json (a document a "
                   "line), .parquet (a document a row), .txt (a document a file); .jsonl and .txt optionally .gz, "
                   ".zst, .bz2 or .xz")
    t.add_argument("-o", "--out", required=True, help="output dataset folder")
    t.add_argument("--tokenizer", default="bytes", help="bytes | PATH/URL to tokenizer.json | tiktoken:PATH")
    t.add_argument("--engine", default="auto", choices=["auto", "gigatoken", "tiktoken", "hf"],
                   help="what encodes a tokenizer.json: auto = the fastest engine proven to give the ids of "
                   "tokenizers (gigatoken, then tiktoken, then hf = tokenizers itself); naming one forces it")
    t.add_argument("--tiktoken-pattern", default=None, metavar="REGEX", help="the split pattern of a tiktoken:PATH "
                   "file that is not a published one (r50k_base, p50k_base, cl100k_base, o200k_base and Llama 3's "
                   "are known by sha256 and need none); its EOS is then <|endoftext|> = the number of ranks")
    t.add_argument("--text-field", default="text", help="JSON/Parquet field holding each document's text")
    t.add_argument("--id-field", default="id", help="field holding each document's id (a stable id is derived "
                   "from file and line when absent)")
    t.add_argument("--format", default="arrow", choices=["arrow", "tar"], help="shard format: Arrow IPC files "
                   "or WebDataset tars")
    t.add_argument("--compression", default="zstd", choices=["zstd", "none"], help="shard compression")
    t.add_argument("--zstd-level", type=int, default=None, help="zstd level: 1 (fast) to 22 (small), or negative "
                   "down to -131072 for faster, larger shards (default: Arrow's own, 1, for arrow shards; 3 for tar)")
    t.add_argument("--shard-size", default="128MB", help="token bytes a shard reaches before it ends, counted "
                   "before compression (e.g. 256MB): a shard ends with the document that reaches it (documents are "
                   "never split, so a shard may pass it by one document; its file also holds ids and offsets); a "
                   "bundle's end also ends its shards")
    t.add_argument("--workers", type=workers_arg, default="auto", help="worker processes: a number, or auto (also "
                   "written 0) for one per CPU")
    t.add_argument("--seed", type=int, default=0, help="seed of the per-document train/val split")
    t.add_argument("--val-fraction", type=float, default=0.0, help="share of documents put in OUT/val "
                   "(0: one dataset in OUT, no split)")
    t.add_argument("--eos", action=argparse.BooleanOptionalAction, default=True, help="append the EOS after each "
                   "document (default; --no-eos: documents run on unended); a post-processor template that ends in "
                   "the EOS gets no second one")
    t.add_argument("--bos", action=argparse.BooleanOptionalAction, default=None, help="put the BOS before each "
                   "document (default: as the tokenizer's post-processor frames a single sequence: Llama-3, "
                   "Llama-2, Mistral yes; GPT-2, Qwen no)")
    t.add_argument("--bos-token", default=None, metavar="TOKEN", help="the BOS's string (implies --bos; default: "
                   "the post-processor's, else tokenizer_config.json's bos_token)")
    t.add_argument("--eos-token", default=None, metavar="TOKEN", help="the EOS's string (default: the eos_token of "
                   "the tokenizer_config.json beside the tokenizer.json, else the tokenizer's end-of-text token)")
    t.add_argument("--special-tokens", default="text", choices=["text", "parse"], help="special-token strings "
                   "inside documents (<|endoftext|>, <s>): text = encoded as the text they are (default: a document "
                   "never injects a control token); parse = as their ids, as tokenizers' encode gives them")
    t.add_argument("--max-errors", type=int, default=100, help="bad records tolerated before failing")
    t.add_argument("--unit-size", default=None, help="input bytes per bundle of work, 64KB or more (JSONL is cut "
                   "into line-aligned pieces of this size, a compressed file as it is decompressed; default 32MB); "
                   "a shard never spans two bundles, so this is an output setting")
    t.add_argument("--num-tasks", type=int, default=1, help="split the job into K task slices (Slurm arrays, ...)")
    t.add_argument("--task-index", type=int, default=0, help="which slice this run does (0-based)")
    t.add_argument("--executor", default="local", choices=["local", "ray"], help="local: a process pool; ray: "
                   "tasks on the Ray cluster at RAY_ADDRESS (extra `ray`)")
    t.add_argument("--overwrite", action="store_true", help="replace an existing dataset made with other settings")
    t.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    t.add_argument("--json", action="store_true", help="print the summary as JSON")
    t.set_defaults(func=run_command)


def workers_arg(text: str) -> int | str:
    """--workers N, or auto (one per CPU); the range is checked with the other settings, in one line."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of processes nor auto") from None


def run_command(args: argparse.Namespace) -> int:
    """Tokenize as the arguments say; print the summary (as JSON with --json)."""
    from dataflow.formats.writer import parse_size
    from dataflow.preprocess.run import TokenizeConfig, tokenize
    from dataflow.tokenizers.tiktoken_files import tiktoken_spec

    tokenizer = tiktoken_spec(args.tokenizer, args.tiktoken_pattern)  # the pattern travels in the spec
    cfg = TokenizeConfig(
        inputs=args.inputs, out=args.out, tokenizer=tokenizer, engine=args.engine,
        text_field=args.text_field, id_field=args.id_field, format=args.format, compression=args.compression,
        zstd_level=args.zstd_level, shard_size=args.shard_size, workers=args.workers, seed=args.seed,
        val_fraction=args.val_fraction, eos=args.eos, bos=args.bos,
        bos_token=args.bos_token, eos_token=args.eos_token, special_tokens=args.special_tokens, max_errors=args.max_errors,
        unit_bytes=parse_size(args.unit_size) if args.unit_size else None, num_tasks=args.num_tasks,
        task_index=args.task_index, executor=args.executor,
        overwrite=args.overwrite, progress=not args.no_progress)
    summary = tokenize(cfg).to_dict()
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
