"""`dataflow tokenize`: inputs -> bundles of units -> workers write finished shards -> ordered commit, resumable.

The input is cut into bundles of at most `--unit-size` of input (`plan.py`), a cut that depends on the
input and the output settings only. Workers tokenize bundles in any order, each into finished shards of
its own (`worker.py`: ids, the validation split, compression and hashing happen there); this process
commits them strictly in input order (`commit.py`: renames, error log, counters), so the bytes depend
only on the data and the settings, never on the number of workers, the executor or interruptions. After
committed bundles the journal (`journal.py`) records the progress, so a rerun of the same command
continues where a crash stopped it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Iterator

import fsspec

import dataflow
from dataflow.errors import ConfigError, DataflowError
from dataflow.formats.manifest import MANIFEST_NAME, Manifest, ShardInfo, TokenizerMeta, read_manifest, write_manifest
from dataflow.formats.writer import DEFAULT_SHARD_SIZE, check_shard_size, check_zstd_level, parse_size, shard_extension
from dataflow.preprocess.blocks import read_unit_blocks
from dataflow.preprocess.commit import commit_bundle
from dataflow.preprocess.executors import run_bundles, start_local_pool, stop_local_pool
from dataflow.preprocess.journal import Progress, load_progress, save_progress, save_seconds
from dataflow.preprocess import output
from dataflow.preprocess.layout import Layout
from dataflow.preprocess.plan import DEFAULT_UNIT_BYTES, Unit, bundle_units, file_sizes, plan_units
from dataflow.preprocess.progress import InputProgress
from dataflow.preprocess.sources import expand_inputs, first_record_fields
from dataflow.preprocess.tokenizers import SAMPLE_CHARS, Tokenizer, load_tokenizer
from dataflow.preprocess.worker import UnitSpec, adopt_tokenizer

MIN_UNIT_SIZE = 64 << 10  # --unit-size below this only multiplies units (a 1-byte unit per input byte)


@dataclass
class TokenizeConfig:
    inputs: list[str]
    out: str
    tokenizer: str = "bytes"
    engine: str = "auto"
    text_field: str = "text"
    id_field: str = "id"
    format: str = "arrow"
    compression: str = "zstd"
    zstd_level: int | None = None
    shard_size: int | str = DEFAULT_SHARD_SIZE
    workers: int | str = "auto"  # "auto" (or 0): one per CPU
    executor: str = "local"
    seed: int = 0
    val_fraction: float = 0.0
    eos: bool = True
    max_errors: int = 100
    unit_bytes: int | None = None  # input per bundle of work (None: DEFAULT_UNIT_BYTES); shards never span two
    num_tasks: int = 1
    task_index: int = 0
    overwrite: bool = False
    progress: bool = True

    def output_settings(self) -> dict[str, Any]:
        """Everything that changes the output bytes; a rerun must match these to resume."""
        d = asdict(self)
        for k in ("out", "workers", "executor", "task_index", "overwrite", "progress"):
            d.pop(k)
        d["unit_bytes"] = self.unit_bytes or DEFAULT_UNIT_BYTES  # shards end where bundles end
        d["shard_size"] = parse_size(self.shard_size)
        return json.loads(json.dumps(d))

    def check(self) -> None:
        """Refuse settings that cannot work or contradict each other: one `ConfigError` line naming the flag."""
        if not self.out:
            raise ConfigError("-o/--out is empty; pass the folder or URL to write the dataset to")
        worker_count(self.workers)
        if not 0 <= self.val_fraction < 1:
            raise ConfigError(f"--val-fraction must lie in [0, 1), got {self.val_fraction}")
        if self.num_tasks < 1 or not 0 <= self.task_index < self.num_tasks:
            raise ConfigError(f"--task-index {self.task_index} must lie in [0, --num-tasks {self.num_tasks})")
        if self.max_errors < 0:
            raise ConfigError("--max-errors must be >= 0")
        if self.zstd_level is not None and self.compression != "zstd":
            raise ConfigError(f"--zstd-level {self.zstd_level} goes with --compression zstd, not --compression "
                              f"{self.compression}; drop one of the two")
        check_zstd_level(self.zstd_level, "--zstd-level")
        if self.unit_bytes is not None and self.unit_bytes < MIN_UNIT_SIZE:
            raise ConfigError(f"--unit-size: {self.unit_bytes:,} bytes is below the {MIN_UNIT_SIZE >> 10}KB minimum "
                              f"(smaller units only add overhead); pass a larger size, or leave it out")
        check_shard_size(self.shard_size, "--shard-size")


def worker_count(workers: int | str) -> int:
    """--workers as a number of processes: "auto" (or 0, its old spelling) is one per CPU."""
    if workers != "auto" and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 0):
        raise ConfigError(f"--workers {workers}: pass a number of worker processes (1 or more), or auto for one "
                          f"per CPU")
    return workers if workers not in ("auto", 0) else os.cpu_count() or 1


@dataclass
class Summary:
    out: str
    datasets: dict[str, dict[str, int]]
    documents: int
    tokens: int
    text_bytes: int
    errors: int
    seconds: float
    tokenizer: str
    engine: str
    engine_reason: str = ""
    resumed_from_unit: int = 0
    units: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["mb_per_s"] = round(self.text_bytes / 1e6 / max(self.seconds, 1e-9), 2)
        d["tokens_per_s"] = round(self.tokens / max(self.seconds, 1e-9))
        return d


def _refuse_if_different(cfg: TokenizeConfig, previous: dict[str, Any] | None, where: str) -> None:
    now = cfg.output_settings()
    if previous != now:
        changed = sorted(k for k in now if (previous or {}).get(k) != now[k])
        raise ConfigError(f"{where} holds work made with other settings ({', '.join(changed) or 'unknown'}); "
                          f"pass --overwrite to replace it")


def _sample_texts(units: list[Unit], cfg: TokenizeConfig, chars: int = SAMPLE_CHARS) -> list[str]:
    """The first ~128K characters of real input: they join the tokenizer engine's equivalence proof (and,
    being input this process checked, stand for the per-process check of processes forked from it)."""
    if cfg.tokenizer == "bytes" or not units:
        return []
    texts, total = [], 0
    for block in read_unit_blocks(units[0], cfg.text_field, cfg.id_field):
        for text in block.texts.drop_null().to_pylist():
            texts.append(text[:chars - total])  # a 50 MB first document is proven on its first part only
            total += len(texts[-1])
            if total >= chars:
                return texts
    return texts


def _check_fields(units: list[Unit], text_field: str, id_field: str) -> None:
    """Fail at once, not after --max-errors bad records, when the first record lacks the text field; or lacks an
    --id-field that was chosen (not the default `id`), which would silently give derived ids instead."""
    if not units:
        return
    fields = first_record_fields(units[0].file, units[0].kind)
    what = "columns" if units[0].kind == "parquet" else "fields"
    checks = [("--text-field", text_field, "the text")]
    if id_field != "id":  # the default may be absent: ids are then derived from file and line
        checks.append(("--id-field", id_field, "the ids"))
    for flag, name, holds in checks:
        if fields is not None and name not in fields:
            raise ConfigError(f"{flag} {name}: the first record of {units[0].file} has no such field (its {what}: "
                              f"{', '.join(fields) or 'none'}); pass {flag} with the one that holds {holds}")


def _display_names(files: list[str]) -> dict[str, str]:
    """Input names relative to their common folder: ids that survive moving the corpus."""
    if len(files) == 1:
        return {files[0]: os.path.basename(files[0])}
    root = os.path.commonpath([f.split("://")[-1] for f in files])
    return {f: os.path.relpath(f.split("://")[-1], root) for f in files}


def tokenize(cfg: TokenizeConfig) -> Summary:
    """Run (or resume) one task of a tokenize job and return its summary."""
    cfg.check()
    started = time.perf_counter()
    files = expand_inputs(cfg.inputs)
    layout = Layout(cfg)
    workers = worker_count(cfg.workers)
    try:
        with _one_run_at_a_time(cfg, layout):
            if cfg.overwrite:
                layout.clear()
            return _tokenize(cfg, started, files, layout, workers)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataflowError(f"{cfg.out}: disk full while writing ({e.strerror}); free space, then rerun the "
                                f"same command: it resumes where it stopped") from None
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and str(e.filename or "").startswith(cfg.out):
            raise ConfigError(f"{cfg.out}: cannot write there ({e.strerror}); choose another -o or fix its "
                              f"permissions") from None
        raise


@contextlib.contextmanager
def _one_run_at_a_time(cfg: TokenizeConfig, layout: Layout) -> Iterator[None]:
    """Hold an exclusive lock on this task's work for the run: a second `dataflow tokenize` into the same
    folder (and task) is refused at once instead of racing the first."""
    work_root = layout.work_root
    made = [d for d in ((work_root,) if layout.remote else (cfg.out, work_root)) if not os.path.isdir(d)]
    # (the folders made are removed again if left empty)
    try:
        os.makedirs(work_root, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{cfg.out}: cannot create the output folder ({e.strerror}); choose another -o or "
                          f"fix its permissions") from None
    lock_path = layout.work + ".lock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    locked = False
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            locked = True
        except BlockingIOError:
            raise ConfigError(f"{cfg.out}: another `dataflow tokenize` is writing this folder"
                              f"{f' (task {cfg.task_index})' if layout.tasked else ''}; wait for it to finish, "
                              f"or write elsewhere with another -o") from None
        yield
    finally:
        if locked:  # still held: a run starting now makes its own lock file
            os.remove(lock_path)
        os.close(fd)
        for folder in (work_root, *[d for d in made if d != work_root]):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only if empty: the work of an unfinished run stays for its resume


def _tokenize(cfg: TokenizeConfig, started: float, files: list[str], layout: Layout, workers: int) -> Summary:
    unit_bytes = cfg.unit_bytes or DEFAULT_UNIT_BYTES
    all_units = plan_units(files, unit_bytes, file_sizes(files), _display_names(files))
    _check_fields(all_units, cfg.text_field, cfg.id_field)
    tok = load_tokenizer(cfg.tokenizer, cfg.engine, sample=_sample_texts(all_units, cfg))
    bundles = bundle_units(all_units, unit_bytes)
    lo = cfg.task_index * len(bundles) // cfg.num_tasks
    hi = (cfg.task_index + 1) * len(bundles) // cfg.num_tasks
    mine = bundles[lo:hi]
    units = [u for bundle in mine for u in bundle]
    journaled = load_progress(layout.work)
    # finished: a manifest and no work left behind (a run killed while closing its splits has written some)
    done = layout.finished_manifest() if journaled is None and not os.path.isdir(layout.work) else None
    if done:
        _refuse_if_different(cfg, read_manifest(done).provenance.get("settings"), cfg.out)
        return _summary_of_finished(cfg, layout, tok, started)
    progress = _start_or_resume(cfg, layout, journaled)
    resumed_from = progress.next_unit if journaled else 0
    metas = _copy_tokenizer(layout, tok)
    spec = UnitSpec(cfg.tokenizer, "hf" if tok.engine == "hf" else cfg.engine, cfg.text_field, cfg.id_field,
                    tok.meta.eos_id if cfg.eos else None, tok.meta, tuple(layout.splits), cfg.format,
                    cfg.compression, parse_size(cfg.shard_size), cfg.zstd_level, cfg.seed, cfg.val_fraction,
                    {split: layout.writer_dir(split) for split in layout.splits} if layout.remote else None)
    todo = [bundle for bundle in mine if bundle[0].index >= progress.next_unit]
    bar = InputProgress(units, len(units) - sum(map(len, todo)), enabled=cfg.progress)
    scratch = os.path.join(layout.work, "units")
    shutil.rmtree(scratch, ignore_errors=True)  # shards of bundles no journal listed: they are made again
    split_dirs = None if layout.remote else {split: layout.writer_dir(split) for split in layout.splits}
    extension = shard_extension(cfg.format, cfg.compression)
    saved = time.monotonic()
    with open(layout.errors, "a") as errlog, _local_pool(cfg, workers, spec, tok) as pool:
        for result in run_bundles(todo, spec, workers, cfg.executor, scratch, pool, piece_bytes=unit_bytes,
                                  first_piece=progress.next_piece):
            commit_bundle(result, progress, scratch, split_dirs, extension, errlog, layout.errors, cfg.max_errors)
            if time.monotonic() - saved >= save_seconds():
                errlog.flush()
                progress.errors_log_bytes = errlog.tell()
                save_progress(layout.work, progress)
                saved = time.monotonic()
            for unit in result.units:
                bar.advance(unit, all_units[unit.index].size, progress.documents, progress.tokens)
    bar.close()
    datasets = _write_manifests(cfg, layout, progress, metas, files, (lo, hi))
    notes = [f"task {cfg.task_index} of {cfg.num_tasks} done; run `dataflow merge {cfg.out}` once all tasks "
             f"are done"] if layout.tasked else []
    return Summary(cfg.out, datasets, progress.documents, progress.tokens, progress.text_bytes, progress.errors,
                   time.perf_counter() - started, tok.meta.name, tok.engine, getattr(tok, "engine_reason", ""),
                   resumed_from, len(units), notes)


def _start_or_resume(cfg: TokenizeConfig, layout: Layout, progress: Progress | None) -> Progress:
    """The journaled progress of an interrupted run (its shards as listed, its error log as long as it was),
    or a fresh journal; refuses work made with other settings."""
    if progress is not None:
        _refuse_if_different(cfg, progress.settings, cfg.out)
    elif not layout.tasked and layout.exists(output.join(layout.split_dir("train"), MANIFEST_NAME)):
        previous = read_manifest(output.join(layout.split_dir("train"), MANIFEST_NAME))
        _refuse_if_different(cfg, previous.provenance.get("settings"), cfg.out)
    elif not layout.tasked and layout.exists(output.join(layout.split_dir("val"), MANIFEST_NAME)):
        _refuse_if_different(cfg, None, cfg.out)
    os.makedirs(layout.work, exist_ok=True)
    for split in layout.splits if not layout.remote else ():  # an object store has no folders to make
        os.makedirs(layout.writer_dir(split), exist_ok=True)
    layout.remove_partial_writes()
    if progress is None:
        progress = Progress(settings=cfg.output_settings())
        with open(layout.errors, "w"):
            pass
        save_progress(layout.work, progress)  # from here on, a rerun resumes
    else:
        with open(layout.errors, "ab") as f:
            f.truncate(progress.errors_log_bytes)
    layout.remove_unlisted_shards({split: {s["path"] for s in shards} for split, shards in progress.shards.items()})
    return progress


def _copy_tokenizer(layout: Layout, tok: Tokenizer) -> dict[str, TokenizerMeta]:
    """The tokenizer's file beside each split's manifest, and the metadata that names it."""
    if not layout.remote:
        return {split: tok.copy_into(layout.writer_dir(split)) for split in layout.splits}
    meta = tok.copy_into(layout.work)
    for split in layout.splits:
        if meta.file:
            output.put_file(os.path.join(layout.work, meta.file), output.join(layout.writer_dir(split), meta.file))
    return {split: meta for split in layout.splits}


def _write_manifests(cfg: TokenizeConfig, layout: Layout, progress: Progress, metas: dict[str, TokenizerMeta],
                     files: list[str], task_bundles: tuple[int, int]) -> dict[str, dict]:
    """Every split's manifest over the shards the journal lists; then the work folder goes."""
    provenance = {"inputs": files, "settings": cfg.output_settings(), "dataflow": dataflow.__version__,
                  "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if layout.tasked:
        provenance["task"] = {"index": cfg.task_index, "of": cfg.num_tasks, "bundles": list(task_bundles)}
    datasets = {}
    for split in layout.splits:
        shards = [ShardInfo(**s) for s in progress.shards.get(split, [])]
        m = Manifest(tokenizer=metas[split], format=cfg.format, compression=cfg.compression,
                     dtype=metas[split].dtype, shards=shards, provenance=provenance)
        if layout.remote:
            output.write_remote_manifest(layout.writer_dir(split), m)
        else:
            write_manifest(layout.writer_dir(split), m)
        datasets[split] = {"documents": m.documents, "tokens": m.tokens, "shards": len(m.shards), "bytes": m.bytes}
    if layout.remote:
        output.put_file(layout.errors, layout.errors_url)
        os.remove(layout.errors)
    shutil.rmtree(layout.work)
    if not layout.remote and not os.listdir(layout.work_root):
        os.rmdir(layout.work_root)  # (a remote run's, with its lock, goes when the lock is released)
    return datasets


@contextlib.contextmanager
def _local_pool(cfg: TokenizeConfig, workers: int, spec: UnitSpec, tok: Tokenizer) \
        -> Iterator[ProcessPoolExecutor | None]:
    """The worker processes of a local run (one for --workers 1; None for Ray), started once the tokenizer is
    loaded and proven here: forked workers inherit it and load nothing, spawned ones load it themselves."""
    if cfg.executor != "local":
        yield None
        return
    adopt_tokenizer(spec.tokenizer, spec.engine, tok)
    pool = start_local_pool(workers, spec.tokenizer, spec.engine)
    try:
        yield pool
    except BaseException:  # Ctrl-C or an error: stop at once, not after the bundles in flight
        stop_local_pool(pool, now=True)
        raise
    stop_local_pool(pool, now=False)


def _summary_of_finished(cfg: TokenizeConfig, layout: Layout, tok, started: float) -> Summary:
    datasets, docs, tokens = {}, 0, 0
    for split in layout.splits:
        m = read_manifest(output.join(layout.writer_dir(split), MANIFEST_NAME))
        datasets[split] = {"documents": m.documents, "tokens": m.tokens, "shards": len(m.shards), "bytes": m.bytes}
        docs, tokens = docs + m.documents, tokens + m.tokens
    log, errors = layout.errors_url if layout.remote else layout.errors, 0
    if layout.exists(log):
        with fsspec.open(log, "rb") as f:
            errors = sum(1 for _ in f)
    return Summary(cfg.out, datasets, docs, tokens, 0, errors, time.perf_counter() - started, tok.meta.name,
                   tok.engine, getattr(tok, "engine_reason", ""), notes=["already complete: nothing to do"])
