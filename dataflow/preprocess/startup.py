"""The start of a `dataflow tokenize` run: what to tokenize, the checks before any commit, the journal.

Every check that can refuse a run happens here, before anything is committed: work of other settings, a
first record without the text field, a tokenizer that does not load, an engine whose ids differ from the
tokenizer's own on a sample of the input. The tokenizer is loaded and its engine proven before the workers
start, so that forked workers inherit it; the input-sample check runs while they already tokenize the first
bundles (`run.py`): their shards stay in the scratch folder, which no journal lists, until it has passed.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from dataflow.debug import cause
from dataflow.errors import ConfigError
from dataflow.formats.remote_errors import explain
from dataflow.formats.manifest import read_manifest
from dataflow.preprocess.config import framed_meta, framing_of, tokenizer_identity
from dataflow.preprocess.journal import (Progress, load_inputs, load_versions, save_inputs, save_progress,
                                         save_versions)
from dataflow.preprocess.layout import OutputLayout
from dataflow.preprocess.task import TaskRun, TaskPlan
from dataflow.sources.pieces import splits_into_pieces
from dataflow.sources import fields_word, first_record_fields, read_unit_blocks
from dataflow.sources.records import Unit
from dataflow.tokenizers.load import SAMPLE_CHARS, Tokenizer, load_tokenizer
from dataflow.preprocess.worker import UnitSpec

if TYPE_CHECKING:
    from dataflow.preprocess.config import ResolvedConfig

# What a run of before framing was recorded did, in today's settings: no BOS, no token named, specials as text.
FRAMING_BEFORE = {"bos": False, "bos_token": None, "eos_token": None, "special_tokens": "text"}
SAMPLE_BLOCK_BYTES = 1 << 18  # JSONL input per block when reading the input sample (its first ~128K characters)


def refuse_if_different(run: TaskRun, previous: dict[str, Any] | None, previous_inputs: list[Any] | None,
                        resuming: Progress | None = None) -> None:
    """A `ConfigError` when the work in the output was made with other output settings than `run`'s, or from
    other input files (`previous_inputs`, the list whose digest `previous` holds: added, removed or resized
    since), unless `resuming` that work can go on over them (see `_resumable`)."""
    now, plan, where = run.settings, run.plan, run.cfg.out
    previous = dict(previous or {})
    if isinstance(previous.get("tokenizer"), str):  # settings of before recorded the tokenizer's path
        previous["tokenizer"] = tokenizer_identity(previous["tokenizer"])
    if previous and "special_tokens" not in previous:  # settings of before framing: no BOS, no token named
        previous = {**FRAMING_BEFORE, **previous}
    if previous == now:
        return
    changed = sorted(k for k in set(now) | set(previous) if previous.get(k) != now.get(k))
    if changed == ["inputs"] and isinstance(previous_inputs, list):
        if resuming is not None and _resumable(plan, previous_inputs, resuming):
            return
        what = _inputs_changed(previous_inputs, plan.inputs)
        raise ConfigError(f"{where} holds work made from other input files ({what}); pass --overwrite to start "
                          f"again from these")
    said = "; ".join(f"{k} was {_shown(previous.get(k))}, now {_shown(now.get(k))}" for k in changed[:3])
    raise ConfigError(f"{where} holds work made with other settings ({', '.join(changed) or 'unknown'}): {said}; "
                      f"pass --overwrite to replace it")


def _shown(value: Any) -> str:
    """A setting's value in a message: JSON text, at most 80 characters."""
    text = "none" if value is None else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= 80 else text[:77] + "..."


def _resumable(plan: TaskPlan, before: list[Any], progress: Progress) -> bool:
    """Whether an interrupted run over the input files `before` ([name, bytes] each) goes on rightly over
    today's: every unit it committed lies in files that are unchanged (any change after them only moves units
    it has not read), or it stopped inside a compressed file that has grown since (a download that ended
    early, replaced whole: its committed pieces are the same bytes)."""
    now = [list(x) for x in plan.inputs]
    before = [list(x) if isinstance(x, (list, tuple)) else x for x in before]
    j = next((i for i, (a, b) in enumerate(zip(before, now)) if a != b), min(len(before), len(now)))
    name = now[j][0] if j < len(now) else None
    first = next((u.index for u in plan.units if u.name == name), len(plan.units))  # file j's first unit
    if progress.next_unit < first or (progress.next_unit == first and progress.next_piece == 0):
        return True
    if progress.next_unit != first or j >= min(len(before), len(now)):
        return False
    grown = before[j][0] == name and isinstance(before[j][1], int) and now[j][1] > before[j][1]
    return grown and splits_into_pieces(plan.units[first])


def refuse_edited(run: TaskRun, before: dict[str, Any] | None) -> None:
    """A `ConfigError` when a file that the interrupted run has committed units of was written again since, to
    the same size (a resize is `refuse_if_different`'s): its units in the dataset hold the old text and the rest
    would be read from the new. `before`: the versions the run saved (None for a run of before them: unchecked)."""
    if not before:
        return
    progress, plan = run.journaled, run.plan
    assert progress is not None
    read = {u.name for u in plan.units[:progress.next_unit]}
    if progress.next_piece and progress.next_unit < len(plan.units):
        read.add(plan.units[progress.next_unit].name)
    sizes = dict((name, size) for name, size in plan.inputs)
    previous = dict((tuple(x)[0], tuple(x)[-1]) for x in load_inputs(run.layout.work) or [] if isinstance(x, list) and x)
    for name, version in plan.versions.items():
        was = before.get(name)
        if name in read and was is not None and version is not None and was != version and \
                previous.get(name, sizes[name]) == sizes[name]:
            raise ConfigError(f"{name}: written again since the interrupted run in {run.cfg.out} read part of it "
                              f"(same size, {was} then, {version} now), so its output would mix old and new text; "
                              f"restore the file as it was, or pass --overwrite to start again from it as it is")


def _inputs_changed(before: list[Any], now: list[list[Any]]) -> str:
    """What differs between two input lists ([name, bytes] each), in a few words."""
    old = {tuple(x)[0]: tuple(x)[-1] for x in before if isinstance(x, (list, tuple)) and x}
    new = dict((name, size) for name, size in now)
    added = [n for n in new if n not in old]
    gone = [n for n in old if n not in new]
    resized = [n for n in new if n in old and old[n] != new[n]]
    parts = [f"{what} {', '.join(map(str, names[:3]))}{' ...' if len(names) > 3 else ''}"
             for what, names in (("added", added), ("gone", gone), ("resized", resized)) if names]
    return "; ".join(parts) or "another order"


def refuse_other_work(run: TaskRun) -> None:
    """Refuse to continue an interrupted run, or to write beside a finished one (with or without a val split),
    of other settings or inputs."""
    layout, journaled = run.layout, run.journaled
    if journaled is not None:
        refuse_if_different(run, journaled.settings, load_inputs(layout.work), resuming=journaled)
        refuse_edited(run, load_versions(layout.work))
        return
    for manifest in layout.manifests_either_layout():
        if layout.exists(manifest):
            provenance = read_manifest(manifest).provenance
            refuse_if_different(run, provenance.get("settings"), provenance.get("input_files"))
    refuse_task_parts(run)


def refuse_task_parts(run: TaskRun) -> None:
    """Refuse a single run into a folder that holds task slices: a later `merge` would list those parts in the
    index.json this run writes, over it."""
    parts = run.layout.task_parts() if not run.layout.tasked else []
    if parts:
        raise ConfigError(f"{run.cfg.out} holds the task slices of a --num-tasks run ({', '.join(parts[:2])}"
                          f"{', ...' if len(parts) > 2 else ''}); run `dataflow merge {run.cfg.out}` on them (if not "
                          f"done yet), pass --overwrite to replace them with this run, or write it elsewhere")


def check_fields(run: TaskRun) -> None:
    """Fail at once, not after --max-errors bad records, when the first record lacks the text field; or lacks an
    --id-field that was chosen (not the default `id`), which would silently give derived ids instead."""
    units, id_field = run.plan.units, run.cfg.id_field
    if not units:
        return
    fields = first_record_fields(units[0].file, units[0].kind)
    what = fields_word(units[0].kind)
    checks = [("--text-field", name, "the text") for name in run.cfg.text.names]
    if id_field != "id":  # the default may be absent: ids are then derived from file and line
        checks.append(("--id-field", id_field, "the ids"))
    for flag, name, holds in checks:
        if fields is not None and name not in fields:
            raise ConfigError(f"{flag} {name}: the first record of {units[0].file} has no such field (its {what}: "
                              f"{', '.join(fields) or 'none'}); pass {flag} with the one that holds {holds}")


def proves_an_engine(cfg: ResolvedConfig) -> bool:
    """Whether loading the tokenizer proves a fast engine against it (a tokenizer.json, unless --engine hf):
    the slow part of the start, and the one whose outcome can change the engine the workers use."""
    return cfg.tokenizer != "bytes" and not cfg.tokenizer.startswith("tiktoken:") and cfg.engine != "hf"


def proven_tokenizer(cfg: ResolvedConfig) -> Tokenizer:
    """The tokenizer with its engine chosen and proven (about a second when this machine remembers the
    proof). Loaded before the workers start: forked workers inherit it instead of each loading it again."""
    try:
        return load_tokenizer(cfg.tokenizer, cfg.engine)
    except Exception as e:  # noqa: BLE001  (a tokenizer URL: its backend missing, no credentials, ...)
        known = explain(cfg.tokenizer, e) if "://" in cfg.tokenizer else None
        if known is None:
            raise
        raise known from cause(e)


def check_on_input(cfg: ResolvedConfig, tok: Tokenizer, units: list[Unit]) -> Tokenizer:
    """`tok` with its engine also compared with `tokenizers` on the first ~128K characters of the input (it
    may settle on `tokenizers` itself); the slow check, run while the workers tokenize the first bundles."""
    if proves_an_engine(cfg):
        tok.check_sample(_sample_texts(units, cfg))
    return tok


def _sample_texts(units: list[Unit], cfg: ResolvedConfig, chars: int = SAMPLE_CHARS) -> list[str]:
    """The first ~128K characters of real input: they join the tokenizer engine's equivalence proof."""
    if cfg.tokenizer == "bytes" or not units:
        return []
    texts, total = [], 0
    for block in read_unit_blocks(units[0], cfg.text, cfg.id_field, jsonl_block=SAMPLE_BLOCK_BYTES):
        for text in block.texts.drop_null().to_pylist():
            texts.append(text[:chars - total])  # a 50 MB first document is proven on its first part only
            total += len(texts[-1])
            if total >= chars:
                return texts
    return texts


def unit_spec(run: TaskRun, tok: Tokenizer, engine: str) -> UnitSpec:
    """What every bundle's worker needs to know (the tokenizer named, not shipped), the framing of the
    documents included: decided here, once, and kept on `tok` for the manifests (`finish.copy_tokenizer`)."""
    cfg, layout = run.cfg, run.layout
    tok.framing = framing = framing_of(cfg, tok)
    return UnitSpec(cfg.tokenizer, engine, cfg.text, cfg.id_field, framing.eos_id,
                    framed_meta(tok.meta, framing), cfg.splits, cfg.format, cfg.compression, cfg.shard_size,
                    cfg.zstd_level, cfg.seed, cfg.val_fraction,
                    layout.upload_dirs(),
                    piece_bytes=cfg.unit_bytes, bos_id=framing.bos_id, special_tokens=framing.special_tokens)


def start_or_resume(run: TaskRun) -> Progress:
    """The journaled progress of an interrupted run (its shards as listed, its error log as long as it was),
    or a fresh journal. Call it once the checks have passed (`ownership.remove_leftovers` ran before the
    workers started)."""
    layout = run.layout
    os.makedirs(layout.work, exist_ok=True)
    layout.make_split_dirs()
    save_inputs(layout.work, run.plan.inputs)  # the inputs as they are now (see `_resumable`)
    save_versions(layout.work, run.plan.versions)  # and their versions (see `refuse_edited`)
    progress = run.journaled
    if progress is None:
        progress = Progress(settings=run.settings, claimed={})
        save_progress(layout.work, progress)  # from here on, a rerun resumes; and the journal makes the log ours,
        with open(layout.errors, "w"):  # so it goes first (a log alone would be refused as another tool's file)
            pass
    else:
        progress.settings = run.settings
        _reopen_error_log(layout, progress.errors_log_bytes)
    return progress


def _reopen_error_log(layout: OutputLayout, length: int) -> None:
    """The error log as long as the journal says (what was logged after its last save goes). A log shorter
    than that is never padded: a run stopped at its very end on an object store had uploaded it already and
    removed the local copy, which comes back from there; any other short log is refused."""
    have = os.path.getsize(layout.errors) if os.path.exists(layout.errors) else 0
    if have < length and layout.restore_error_log():
        have = os.path.getsize(layout.errors)
    if have < length:
        raise ConfigError(f"{layout.errors}: the error log of the unfinished run is {have:,} bytes, its journal "
                          f"counts {length:,}: it was cut or removed; pass --overwrite to start again")
    with open(layout.errors, "ab") as f:
        f.truncate(length)
