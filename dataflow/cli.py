"""The `dataflow` command: argument parsing and dispatch only; each command calls one library function.

Exit codes: 0 done, 1 failed (the message says why), 2 usage error (a bad flag, a path that is not a
dataset, missing credentials or an optional package). Errors are one line on stderr; `--debug` or
`DATAFLOW_DEBUG=1` shows the full traceback instead.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import itertools
import json
import os
import sys
from typing import Callable, Sequence

from dataflow import env
from dataflow.audit.command import add_audit_parser
from dataflow.preprocess.command import add_tokenize_parser
from dataflow.convert.command import add_convert_parser
from dataflow.debug import debug_enabled
from dataflow.errors import ConfigError, DataflowError
from dataflow.profiling.subcommand import add_profile_parser
from dataflow.sizes import count

DISTRIBUTION = "dataflow-lm"


class _HelpFormatter(argparse.HelpFormatter):
    """Appends each flag's default to its help, unless the help already says it or there is none."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or any(action.default is v for v in (None, False, argparse.SUPPRESS)) \
                or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


class _Version(argparse.Action):
    """Prints `version_line()` as it is (argparse's own action rewraps it) and exits 0."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        print(version_line())
        parser.exit()


def version_line() -> str:
    """`dataflow --version`: this package, the on-disk format it writes, Python and torch."""
    import platform
    from importlib import metadata

    from dataflow.version import __version__
    from dataflow.formats.manifest import FORMAT_VERSION

    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = "not installed"
    return (f"dataflow {__version__} ({DISTRIBUTION}; on-disk format version {FORMAT_VERSION}; "
            f"Python {platform.python_version()}; torch {torch})")


def _progress(args: argparse.Namespace, total: int, unit: str, desc: str):
    from tqdm import tqdm

    return tqdm(total=total, unit=unit, unit_scale=unit == "B", desc=desc, disable=args.no_progress,
                dynamic_ncols=True, file=sys.stderr)


def _dataset(path: str):
    from dataflow.formats.manifest import read_manifest

    manifest = read_manifest(path)
    return (os.path.dirname(path) if path.endswith(".json") else path), manifest


def _shard_files(root: str, stack: contextlib.ExitStack):
    """None (shards read in place) for a local dataset; for a URL, shards downloaded one at a time, verified and
    retried by `Storage`, into a private temporary cache that holds one shard (limit 1 byte: each download
    evicts the last)."""
    import tempfile

    from dataflow.formats.reader import Fetched
    from dataflow.formats.remote import is_remote
    from dataflow.loading.storage import Storage

    if not is_remote(root):
        return None
    storage = stack.enter_context(Storage(root, stack.enter_context(tempfile.TemporaryDirectory(
        prefix="dataflow-shards-")), cache_limit=1))
    return Fetched(storage.url, storage.local_path, lambda shard: storage.release(shard, decoded_copy=False))


def _decoded(root: str, manifest, stack: contextlib.ExitStack):
    """The dataset's documents as text (`decode_documents`), its shards fetched one at a time when remote."""
    from dataflow.preprocess.decode import decode_documents

    files = _shard_files(root, stack)
    return decode_documents(root, manifest) if files is None else decode_documents(root, manifest, files=files)


def cmd_inspect(args: argparse.Namespace) -> int:
    from dataflow.formats.inspect import describe, format_description

    root, manifest = _dataset(args.path)
    with contextlib.ExitStack() as stack:
        docs = _decoded(root, manifest, stack) if args.decode else iter(())
        stack.callback(getattr(docs, "close", lambda: None))  # the shard it stopped in, released first
        info = describe(root, manifest, itertools.islice(docs, args.decode))
    print(json.dumps(info, indent=1, ensure_ascii=False) if args.json else format_description(info))
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    from dataflow.formats.verify import verify_dataset

    root, manifest = _dataset(args.path)
    with contextlib.ExitStack() as stack:
        files = _shard_files(root, stack)
        bar = stack.enter_context(_progress(args, manifest.bytes, "B", "verify"))
        problems = verify_dataset(root, manifest, on_shard=lambda s: bar.update(s.bytes), files=files)
    for p in problems:
        print(f"BAD {p.path}: {p.problem}", file=sys.stderr)
    bad = [p for p in problems if p.path != "index.json"]
    if bad:
        print(f"{len(bad)} of {len(manifest.shards)} shard{'s are' if len(manifest.shards) != 1 else ' is'} bad",
              file=sys.stderr)
    if problems:
        return 1
    print(f"ok: {count(len(manifest.shards), 'shard')}, {count(manifest.documents, 'document')}, "
          f"{count(manifest.tokens, 'token')} verified")
    return 0


def cmd_decode(args: argparse.Namespace) -> int:
    from dataflow.convert.outputs import write_error

    root, manifest = _dataset(args.path)
    to_file = args.output not in (None, "-")
    if to_file:
        _check_decode_output(args.output, root)
    try:
        with contextlib.ExitStack() as stack:  # -o FILE appears whole, or not at all
            out = _decode_output(args, stack) if to_file else sys.stdout
            records = _decoded(root, manifest, stack)
            bar = stack.enter_context(_progress(args, manifest.documents, "doc", "decode"))
            for record in records:
                out.write(json.dumps(record, ensure_ascii=False) + "\n")
                bar.update(1)
    except OSError as e:  # a read-only folder, one under a file, a full disk: one line
        known = write_error(e, args.output) if to_file else None
        if known is None:
            raise
        raise known from None
    if to_file:
        print(f"decoded {count(manifest.documents, 'document')} into {args.output}", file=sys.stderr)
    return 0


def _decode_output(args: argparse.Namespace, stack: contextlib.ExitStack):
    """The text file `decode -o` writes, under convert's rule for outputs (`convert.outputs.files`): a regular
    file, replaced only with --overwrite, written to a temp file renamed over it (or uploaded to a URL) once
    every document is in."""
    from dataflow.convert.outputs import files
    from dataflow.formats.atomic import atomic_open

    (local,) = stack.enter_context(files([args.output], args.overwrite, stdout=True))
    return stack.enter_context(atomic_open(local, "w"))


def _check_decode_output(output: str, root: str) -> None:
    """`decode -o` must name a file outside the dataset (a folder fails after the whole decode; a path in the
    dataset would replace one of its files)."""
    from dataflow.formats.remote import is_remote

    if is_remote(output):
        return
    output = output.removeprefix("file://")
    if os.path.isdir(output):
        raise ConfigError(f"-o {output}: is a folder; pass the path of the JSONL file to write")
    if "://" not in root:
        dataset, target = os.path.realpath(root), os.path.realpath(output)
        if os.path.commonpath([dataset, target]) == dataset:
            raise ConfigError(f"-o {output}: lies inside the dataset {root} (it would replace or add to its "
                              f"files); write the JSONL elsewhere")


def cmd_merge(args: argparse.Namespace) -> int:
    from dataflow.preprocess.merge import merge

    for split, m in merge(args.out).items():
        print(f"{split}: merged {count(len(m.provenance['parts']), 'part')}: {count(m.documents, 'document')}, "
              f"{count(m.tokens, 'token')}, {count(len(m.shards), 'shard')}")
    return 0


def _documents(text: str) -> int:
    """--decode N: a number of documents, 0 or more."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of documents (0 or more)")
    return n


def _add_decode_parser(add: Callable[[str, str], argparse.ArgumentParser]) -> None:
    """`dataflow decode`: `add(name, help)` makes the subparser (as in `build_parser`)."""
    d = add("decode", "every document back as JSONL {id, text}, in stored order")
    d.add_argument("path", help="a dataset folder or URL made by `dataflow tokenize` (it holds index.json)")
    d.add_argument("-o", "--output", default=None, help="write to this file (a path or a URL), whole or not at "
                   "all; - or none: standard output")
    d.add_argument("--overwrite", action="store_true", help="replace the -o file if it exists (a device or FIFO "
                   "never is)")
    d.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    d.set_defaults(func=cmd_decode)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dataflow", description="Keep GPUs fed: tokenize, inspect, verify, decode, "
                                "convert and profile token datasets; train a GPT on them.",
                                formatter_class=_HelpFormatter)
    p.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    p.add_argument("--debug", action="store_true", help="show full tracebacks (also DATAFLOW_DEBUG=1)")
    sub = p.add_subparsers(dest="command", required=True)

    def add(name: str, helptext: str) -> argparse.ArgumentParser:
        c = sub.add_parser(name, help=helptext, description=helptext, formatter_class=_HelpFormatter)
        c.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                       help="show full tracebacks (also DATAFLOW_DEBUG=1)")
        return c

    add_tokenize_parser(add)

    g = add("merge", "one manifest over the parts of a --num-tasks run")
    g.add_argument("out", help="the OUT folder the task slices wrote into")
    g.set_defaults(func=cmd_merge)

    i = add("inspect", "manifest summary, shard table, first documents")
    i.add_argument("path", help="a dataset folder or URL made by `dataflow tokenize` (it holds index.json)")
    i.add_argument("--json", action="store_true", help="print the manifest (and documents) as JSON")
    i.add_argument("--decode", type=_documents, default=0, metavar="N", help="show the first N documents as text")
    i.set_defaults(func=cmd_inspect)

    v = add("verify", "check every shard against the manifest (exit 1 naming each bad shard)")
    v.add_argument("path", help="a local dataset folder made by `dataflow tokenize`")
    v.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    v.set_defaults(func=cmd_verify)

    _add_decode_parser(add)
    add_audit_parser(add)

    add_convert_parser(sub)
    sub.add_parser("train", add_help=False, help="train the bundled GPT: dataflow train --config demo --set "
                   "data.path=DATA (the same as python -m trainer; dataflow train --help for its flags)")
    add_profile_parser(sub, formatter_class=_HelpFormatter)
    sub.choices["profile"].add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                                        help="show full tracebacks (also DATAFLOW_DEBUG=1)")
    return p


def run_trainer(argv: list[str]) -> int:
    """`dataflow train ARGS`: the bundled trainer (`python -m trainer ARGS`), found through the 'dataflow.train'
    entry point so that this package never imports the trainer."""
    from importlib.metadata import entry_points

    found = list({e.value: e for e in entry_points(group="dataflow.train")}.values())
    if not found:
        print("dataflow train: error: no trainer is registered in the 'dataflow.train' entry-point group; "
              "reinstall the project (pip install dataflow-lm, or pip install -e . in a clone)", file=sys.stderr)
        return 2
    return found[0].load()(argv, prog="dataflow train")


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["train"]:  # the trainer parses its own arguments (and checks the environment through this)
        try:
            env.check_all()
        except ConfigError as e:
            print(f"dataflow train: error: {e}", file=sys.stderr)
            return 2
        return run_trainer(argv[1:])
    args = build_parser().parse_args(argv)
    if getattr(args, "debug", False):
        os.environ["DATAFLOW_DEBUG"] = "1"  # library errors then keep their causes too
    try:
        env.check_all()
        return args.func(args)
    except DataflowError as e:
        if debug_enabled():
            raise
        print(f"dataflow {args.command}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ConfigError) else 1
    except KeyboardInterrupt:
        print(f"dataflow {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `dataflow decode x | head`
        sys.stderr.close()
        return 0


def run() -> None:
    """The `dataflow` command: `main`, then an exit that skips the interpreter's garbage collections over every
    object the command imported (0.2-0.3 s after a tokenize, for memory the process gives back anyway)."""
    code = main()
    gc.freeze()
    sys.exit(code)


if __name__ == "__main__":
    run()
