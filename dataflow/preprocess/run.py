"""`dataflow tokenize`: inputs -> bundles of units -> workers write finished shards -> ordered commit, resumable.

The input is cut into bundles of at most `--unit-size` of input (`plan.py`), a cut that depends on the
input and the output settings only. Workers tokenize bundles in any order, each into finished shards of
its own (`worker.py`: ids, the validation split, compression and hashing happen there), on an executor
that owns them (`executors.py`); this process commits them strictly in input order (`commit.py`: renames,
error log, counters, journal), so the bytes depend only on the data and the settings, never on the number
of workers, the executor or interruptions. After committed bundles the journal (`journal.py`) records the
progress, so a rerun of the same command continues where a crash stopped it.

The start (`startup.py`) loads and proves the tokenizer before the workers fork (they inherit it), and
checks it on a sample of the input while they tokenize their first bundles; nothing is committed before
that check has passed. The end (`finish.py`) writes the manifests.
This module only wires those together.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Iterator

from dataflow import locks
from dataflow.debug import cause
from dataflow.errors import ConfigError, DataflowError
from dataflow.formats.manifest import read_manifest
from dataflow.formats.writer import shard_extension
from dataflow.preprocess import ownership, startup
from dataflow.preprocess.commit import Committer
from dataflow.preprocess.config import ResolvedConfig, TokenizeConfig
from dataflow.preprocess.executors import Executor, make_executor
from dataflow.preprocess.finish import copy_tokenizer, finished_counts, refuse_empty, write_manifests
from dataflow.preprocess.journal import Progress
from dataflow.preprocess.layout import OutputLayout, layout_of
from dataflow.preprocess.progress import InputProgress
from dataflow.preprocess.task import TaskRun, open_run
from dataflow.sources import Reading, expand_inputs, read_bundles, workers_read_whole
from dataflow.tokenizers.load import Tokenizer, load_tokenizer
from dataflow.preprocess.worker import UnitSpec, adopt_tokenizer


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


def tokenize(config: TokenizeConfig) -> Summary:
    """Run (or resume) one task of a tokenize job and return its summary."""
    cfg = config.resolve()
    started = time.perf_counter()
    files = expand_inputs(cfg.inputs, leave_out=ownership.written_by_runs_into(cfg.out))  # never its own output
    layout = layout_of(cfg)
    layout.check_reachable()
    try:
        with _one_run_at_a_time(cfg, layout):
            tok = None
            if cfg.overwrite:  # a run refused by its checks removes nothing: they pass before the earlier dataset goes
                tok = _check_before_replacing(open_run(cfg, layout, files, started, journal=False))
                _replace_earlier(cfg, layout)
            return _tokenize(open_run(cfg, layout, files, started), tok)
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DataflowError(f"{cfg.out}: disk full while writing ({e.strerror}); free space, then rerun the "
                                f"same command: it resumes where it stopped") from None
        if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS) and str(e.filename or "").startswith(cfg.out):
            raise ConfigError(f"{cfg.out}: cannot write there ({e.strerror}); choose another -o or fix its "
                              f"permissions") from None
        _raise_storage_error(layout, e)
        raise
    except DataflowError:
        raise
    except Exception as e:  # noqa: BLE001
        _raise_storage_error(layout, e)
        raise


def _raise_storage_error(layout: OutputLayout, e: BaseException) -> None:
    """What an object store said mid-run (credentials that expired, an endpoint gone), as one line."""
    known = layout.explain(e)
    if known is not None:
        raise known from cause(e)


@contextlib.contextmanager
def _one_run_at_a_time(cfg: ResolvedConfig, layout: OutputLayout) -> Iterator[None]:
    """Hold an exclusive lock on this task's work for the run: a second `dataflow tokenize` into the same
    folder (and task) is refused at once instead of racing the first."""
    work_root = layout.work_root
    made = [d for d in layout.folders_to_lock() if not os.path.isdir(d)]
    # (the folders made are removed again if left empty)
    if os.path.lexists(work_root) and not os.path.isdir(work_root):
        raise ConfigError(f"{work_root}: a file where the run keeps its work (journal, lock); it was not written "
                          f"by dataflow: move it away, or write the dataset elsewhere with another -o")
    try:
        os.makedirs(work_root, exist_ok=True)
    except OSError as e:
        raise ConfigError(f"{cfg.out}: cannot create the output folder ({e.strerror}); choose another -o or "
                          f"fix its permissions") from None
    try:
        with _exclusive_lock(layout.work + ".lock") as mine:
            if not mine:
                raise ConfigError(f"{cfg.out}: another `dataflow tokenize` is writing this folder"
                                  f"{f' (task {cfg.task_index})' if layout.tasked else ''}; wait for it to finish, "
                                  f"or write elsewhere with another -o")
            yield
    finally:
        for folder in (work_root, *[d for d in made if d != work_root]):
            with contextlib.suppress(OSError):
                os.rmdir(folder)  # only if empty: the work of an unfinished run stays for its resume


@contextlib.contextmanager
def _exclusive_lock(path: str) -> Iterator[bool]:
    """An exclusive, non-blocking lock of `path` (made if missing) for the block; False: another process
    holds it. The one place tokenize locks."""
    fd = locks.lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
    if fd is None:
        yield False
        return
    try:
        yield True
    finally:
        os.remove(path)  # while still held: a run starting now makes its own lock file
        locks.unlock(fd)


def _check_before_replacing(run: TaskRun) -> Tokenizer:
    """--overwrite: the checks that refuse a run before its first write (the tokenizer loads and is proven, the
    input has the fields), made before the earlier dataset is removed; the tokenizer, which the run then uses.
    Its settings need not match the dataset it replaces."""
    startup.check_fields(run)
    return startup.proven_tokenizer(run.cfg)


def _replace_earlier(cfg: ResolvedConfig, layout: OutputLayout) -> None:
    """--overwrite: this task's earlier dataset and work go, and for a single run the task slices it replaces,
    each under its own run lock (a slice's run still writing is refused, not removed under it)."""
    slices = _slices_replaced(cfg, layout)
    with contextlib.ExitStack() as held:
        for other in slices:
            if other.work != layout.work and not held.enter_context(_exclusive_lock(other.work + ".lock")):
                raise ConfigError(f"{cfg.out}: a `dataflow tokenize --num-tasks` run is writing its task slice "
                                  f"{other.part}; wait for it to finish before replacing it with --overwrite")
        ownership.replace_earlier([layout, *slices])


def _slices_replaced(cfg: ResolvedConfig, layout: OutputLayout) -> list[OutputLayout]:
    """--overwrite of a single run over the task slices of a --num-tasks run (merged or not): their layouts, so
    that what each slice's manifest and journal list goes with the rest (a slice holding files not ours is
    refused, as a dataset is)."""
    if layout.tasked:
        return []
    tasks = sorted({int(m.group(1)) for part in layout.task_parts()
                    if (m := re.fullmatch(r"part-(\d+)", os.path.basename(part)))})
    return [layout_of(dataclasses.replace(cfg, num_tasks=max(tasks[-1] + 1, 2), task_index=k)) for k in tasks]


def _tokenize(run: TaskRun, tok: Tokenizer | None = None) -> Summary:
    """The run, with the tokenizer when it is loaded already (--overwrite checked it first)."""
    cfg, layout, plan, journaled = run.cfg, run.layout, run.plan, run.journaled
    # finished: a manifest and no work left behind (a run killed while closing its splits has written some)
    done = layout.finished_manifest() if journaled is None and not os.path.isdir(layout.work) else None
    if done and ownership.manifest_of_ours(layout.writer_dir("train")):
        return _summary_of_finished(run, done)
    ownership.refuse_foreign(layout, ownership.owned(layout, journaled))
    startup.refuse_other_work(run)
    startup.check_fields(run)
    start = run.resumed_from
    todo = [bundle for bundle in plan.bundles if bundle[0].index >= start[0]]
    scratch = os.path.join(layout.work, "units")
    shutil.rmtree(scratch, ignore_errors=True)  # shards of bundles no journal listed: they are made again
    ownership.remove_leftovers(layout, journaled)
    if todo:
        layout.save_claims((todo[0][0].index, todo[-1][-1].index + 1))  # before any upload
    with make_executor(cfg.executor, cfg.workers, cfg.tokenizer, cfg.engine) as executor, \
            contextlib.ExitStack() as readings:

        whole = workers_read_whole(todo, cfg.workers)  # each compressed file read by its worker, else cut here

        def work() -> Reading:  # read again if the workers start again
            spill = _spill_folder(scratch) if executor.local and not whole else None
            reading = read_bundles(todo, cfg.unit_bytes, start[1], spill, whole, depth=cfg.workers + 2)
            return readings.enter_context(contextlib.closing(reading))

        try:
            # a compressed input starts decompressing now, while the tokenizer loads (readers/cut_process.py)
            tok, spec = _start_workers(run, executor, work(), work, scratch, tok)
        except BaseException:  # a check failed (or Ctrl-C): nothing was committed, and nothing stays
            executor.stop(now=True)
            shutil.rmtree(scratch, ignore_errors=True)
            if journaled is None:
                ownership.forget_fresh_start(layout)
            raise
        progress = startup.start_or_resume(run)
        metas = copy_tokenizer(layout, tok)
        done_units = len(plan.task_units) - sum(map(len, todo))
        progress = _commit_all(run, executor.results(), progress, scratch, done_units)
    if not cfg.tasked:  # (a task's slice may hold nothing; the merge of the slices is checked)
        refuse_empty(run, progress)
    datasets = write_manifests(run, progress, metas)
    notes = [f"task {cfg.task_index} of {cfg.num_tasks} done; run `dataflow merge {cfg.out}` once all tasks "
             f"are done"] if cfg.tasked else []
    return Summary(cfg.out, datasets, progress.documents, progress.tokens, progress.text_bytes, progress.errors,
                   time.perf_counter() - run.started, tok.meta.name, tok.engine, getattr(tok, "engine_reason", ""),
                   start[0] if journaled else 0, len(plan.task_units), notes)


def _start_workers(run: TaskRun, executor: Executor, reading: Reading, work: Callable[[], Reading],
                   scratch: str, tok: Tokenizer | None = None) -> tuple[Tokenizer, UnitSpec]:
    """Load and prove the tokenizer, set the workers on the bundles of `reading` (forked ones inherit the
    tokenizer loaded here and rely on its checks), then check it on the input meanwhile. Should the check
    change what the workers were given (settle on `tokenizers` instead of the engine, or correct the vocabulary
    size or EOS), their shards are dropped and they start again on a new reading (`work()`). Returns the
    checked tokenizer and the spec the bundles run with."""

    def spec_for(tok: Tokenizer) -> UnitSpec:
        # the workers are told the engine asked for, unless the checks here settled on `tokenizers`
        return startup.unit_spec(run, tok, "hf" if tok.engine == "hf" else run.cfg.engine)

    def launch(tok: Tokenizer, bundles: Reading) -> UnitSpec:
        spec = spec_for(tok)
        tok.share_check_with_forks()  # forked workers rely on check_on_input below (and are restarted if it fails)
        adopt_tokenizer(spec.tokenizer, spec.engine, tok)  # before the workers fork; bundles run here use it too
        executor.submit(bundles, spec, scratch)
        return spec

    tok = tok or startup.proven_tokenizer(run.cfg)
    spec = launch(tok, reading)
    tok = startup.check_on_input(run.cfg, tok, run.plan.units)
    if spec_for(tok) != spec:  # settled on `tokenizers`, or the metadata remembered on this machine was wrong
        executor.stop(now=True)
        reading.close()
        shutil.rmtree(scratch, ignore_errors=True)
        spec = launch(tok, work())
    return tok, spec


def _spill_folder(scratch: str) -> str:
    """A new folder for the spill files of one reading of the input: a reading stopped (its cut process may
    still be writing) never writes into the next one's."""
    os.makedirs(scratch, exist_ok=True)
    return tempfile.mkdtemp(prefix="pieces-", dir=scratch)


def _commit_all(run: TaskRun, results: Iterator, progress: Progress, scratch: str, done_units: int) -> Progress:
    """Commit every bundle's result in input order, with a progress bar over the input's bytes."""
    cfg, layout, plan = run.cfg, run.layout, run.plan
    units = plan.task_units
    bar = InputProgress(units, done_units, enabled=cfg.progress)
    committer = Committer(progress, layout.work, scratch, layout.rename_dirs(), shard_extension(cfg.format, cfg.compression),
                          layout.errors, cfg.max_errors)
    with committer:
        for result in results:
            committer.commit(result)
            for unit in result.units:
                bar.advance(unit, plan.units[unit.index].size, committer.progress.documents,
                            committer.progress.tokens)
    bar.close()
    return committer.progress


def _summary_of_finished(run: TaskRun, manifest: str) -> Summary:
    """A rerun of a finished run: its counts, once its settings (inputs included) are checked to be the same."""
    cfg = run.cfg
    provenance = read_manifest(manifest).provenance
    startup.refuse_if_different(run, provenance.get("settings"), provenance.get("input_files"))
    tok = load_tokenizer(cfg.tokenizer, cfg.engine)
    datasets, docs, tokens, errors = finished_counts(run.layout)
    return Summary(cfg.out, datasets, docs, tokens, 0, errors, time.perf_counter() - run.started, tok.meta.name,
                   tok.engine, getattr(tok, "engine_reason", ""), notes=["already complete: nothing to do"])
