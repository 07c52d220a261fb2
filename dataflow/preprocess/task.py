"""One task of a `dataflow tokenize` run, resolved once: its settings, where it writes, what it tokenizes and
the journal it resumes (`TaskRun`), which the start, the commit and the end all read instead of each being handed
the same pieces. The plan (`TaskPlan`) is the input's cut into units and bundles, and this task's bundles."""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass
from typing import Any

from dataflow.preprocess.config import ResolvedConfig
from dataflow.preprocess.journal import Progress, load_progress
from dataflow.preprocess.layout import OutputLayout
from dataflow.preprocess.plan import bundle_units, file_facts, plan_units
from dataflow.sources.records import Unit


@dataclass
class TaskPlan:
    """The units of the whole input, and the bundles of them that this task tokenizes."""

    units: list[Unit]  # every unit of every input, in order
    bundles: list[list[Unit]]  # this task's
    task_bundles: tuple[int, int]  # which bundles of the whole input those are: [lo, hi)
    inputs: list[list[Any]]  # every input file as [its name in ids, its bytes]: what a resume must find again
    versions: dict[str, str | None]  # each input's version by its name in ids (`plan.file_facts`): an edit in place

    @property
    def task_units(self) -> list[Unit]:
        return [u for bundle in self.bundles for u in bundle]


def plan_task(cfg: ResolvedConfig, files: list[str]) -> TaskPlan:
    """Cut the input into units and bundles (by the input and the output settings only), and take this task's."""
    facts, names = file_facts(files), _display_names(files)
    sizes = [size for size, _ in facts]
    units = plan_units(files, cfg.unit_bytes, sizes, names)
    bundles = bundle_units(units, cfg.unit_bytes)
    lo = cfg.task_index * len(bundles) // cfg.num_tasks
    hi = (cfg.task_index + 1) * len(bundles) // cfg.num_tasks
    return TaskPlan(units, bundles[lo:hi], (lo, hi), [[names[f], size] for f, size in zip(files, sizes)],
                    {names[f]: version for f, (_, version) in zip(files, facts)})


def _display_names(files: list[str]) -> dict[str, str]:
    """Input names relative to their common folder: ids that survive moving the corpus."""
    if len(files) == 1:
        return {files[0]: os.path.basename(files[0])}
    root = os.path.commonpath([f.split("://")[-1] for f in files])
    return {f: os.path.relpath(f.split("://")[-1], root) for f in files}


@dataclass(frozen=True)
class TaskRun:
    """What one task of a tokenize run holds, fixed at its start (`open_run`); the progress it makes is the
    committer's (`commit.Committer`)."""

    cfg: ResolvedConfig
    layout: OutputLayout
    files: list[str]  # the input files, listed
    plan: TaskPlan
    journaled: Progress | None  # the journal of an interrupted run of this task, None for a fresh start
    started: float  # time.perf_counter() at the start, for the summary

    @functools.cached_property
    def settings(self) -> dict[str, Any]:
        """The output settings over these inputs (the input digest included), computed once, when first needed
        (the tokenizer's digest reads its file: after the checks that come first)."""
        return self.cfg.output_settings(self.plan.inputs)

    @property
    def resumed_from(self) -> tuple[int, int]:
        """Where this run starts: the journal's next unit and piece, (0, 0) for a fresh start."""
        return (self.journaled.next_unit, self.journaled.next_piece) if self.journaled else (0, 0)


def open_run(cfg: ResolvedConfig, layout: OutputLayout, files: list[str], started: float, journal: bool = True) -> TaskRun:
    """The run of this task over `files`: planned, and its journal (if any) read, unless `journal=False` (a fresh
    start: --overwrite checks the run before it removes the earlier one, journal included, damaged or not)."""
    plan = plan_task(cfg, files)
    return TaskRun(cfg, layout, files, plan, load_progress(layout.work) if journal else None, started)
