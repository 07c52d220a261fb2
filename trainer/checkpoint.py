"""Sharded, atomic, resumable checkpoints: DCP for model + optimizer, JSON for everything else.

    DIR/step-000123/          complete checkpoint (only these are ever loaded)
        .metadata, *.distcp   torch.distributed.checkpoint, each rank writes its own shards
        rng-rank00000.json    that rank's RNG states, as lists
        trainer_state.json    step, run id, schedule, loader state, counters (written last)
    DIR/step-000124.tmp/      being written; renamed to step-000124/ once every rank has finished

DIR belongs to one run (`Checkpointer.begin`): the run id in `trainer_state.json` tells a new run's checkpoints
from an older run's, so pruning keeps this run's newest and a resume never continues another run silently.

DCP pickles its metadata and non-tensor values; loading goes through an allow-list unpickler and
`torch.load(weights_only=True)`, so a checkpoint folder cannot run code.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import random
import re
import shutil
import tempfile
import uuid
import warnings
from typing import Any, Callable, Iterator

import numpy as np
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import Metadata
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

from dataflow.errors import ConfigError, FormatError
from trainer.parallelize import Dist

STATE_FILE = "trainer_state.json"
STATE_VERSION = 1
_NAME = re.compile(r"^step-(\d{6,})$")


def checkpoint_name(step: int) -> str:
    return f"step-{step:06d}"


def is_complete(path: str) -> bool:
    return os.path.isfile(os.path.join(path, STATE_FILE)) and os.path.isfile(os.path.join(path, ".metadata"))


def complete_checkpoints(root: str) -> list[tuple[int, str]]:
    """(step, path) of every complete checkpoint under `root`, oldest first; `*.tmp` and partial dirs are skipped."""
    if not root or not os.path.isdir(root):
        return []
    found = []
    for name in os.listdir(root):
        m = _NAME.match(name)
        path = os.path.join(root, name)
        if m and is_complete(path):
            found.append((int(m.group(1)), path))
    return sorted(found)


def resolve_resume(root: str, resume: str) -> str | None:
    """The checkpoint to start from: None for a fresh start."""
    if resume == "none":
        return None
    if resume == "auto":
        found = complete_checkpoints(root)
        return found[-1][1] if found else None
    if not is_complete(resume):
        raise ConfigError(f"checkpoint.resume = {resume!r} is not a complete checkpoint folder "
                          f"(needs {STATE_FILE} and .metadata); use \"auto\", \"none\" or a step-NNNNNN folder")
    return resume


def _state_of(path: str) -> dict[str, Any]:
    """A checkpoint's trainer state as far as it reads ({} when it does not: `load` names what is wrong)."""
    try:
        with open(os.path.join(path, STATE_FILE)) as f:
            state = json.load(f)
    except (OSError, ValueError):
        return {}
    return state if isinstance(state, dict) else {}


def run_of(path: str) -> str | None:
    """The run id of a checkpoint: None for one written before run ids (a run that resumed one keeps none)."""
    return _state_of(path).get("run_id")


def _names(found: list[tuple[int, str]]) -> str:
    names = [os.path.basename(p) for _, p in found]
    return ", ".join(names) if len(names) <= 4 else f"{names[0]}, {names[1]} ... {names[-1]} ({len(names)})"


def _not_ours(root: str, resumed: str | None, run_id: str | None) -> tuple[str, str, list[tuple[int, str]]] | None:
    """(whose, why, which) when complete checkpoints in `root` are not the history of the run that starts from
    `resumed` (None: a new run): another run's, or this run's later than `resumed`; None when all are."""
    found = [(s, p) for s, p in complete_checkpoints(root)
             if not resumed or os.path.realpath(p) != os.path.realpath(resumed)]
    if not resumed:
        return ("another run's", f"checkpoints of another run ({_names(found)}); a new run (checkpoint.resume = "
                                 f"\"none\") would mix its own with them: train that run on (checkpoint.resume = "
                                 f"\"auto\")", found) if found else None
    other = [(s, p) for s, p in found if run_of(p) != run_id]
    if other:
        return ("another run's", f"checkpoints of another run ({_names(other)}) than {resumed}, which this run "
                                 f"continues: name the one to train on (checkpoint.resume = FOLDER)", other)
    start = _state_of(resumed).get("step", -1)
    later = [(s, p) for s, p in found if s > start]
    if later:
        return ("this run's later", f"checkpoints of this run ({_names(later)}) later than {resumed}, which it "
                                    f"trains on from, and two histories of one run would mix: resume the newest "
                                    f"(checkpoint.resume = \"auto\")", later)
    return None


# --- safe loading -------------------------------------------------------------------------------
_DCP = "torch.distributed.checkpoint.metadata"
# Every global a `.metadata` may name, as exact (module, name) pairs. Names are compared whole: pickle
# resolves a dotted name attribute by attribute ("os.system" inside an allowed module reaches os), so a
# dotted name is never on this list and never looked up.
ALLOWED_GLOBALS: frozenset[tuple[str, str]] = frozenset(
    [(_DCP, name) for name in ("Metadata", "MetadataIndex", "StorageMeta", "ChunkStorageMetadata",
                               "TensorStorageMetadata", "BytesStorageMetadata", "TensorProperties",
                               "_MEM_FORMAT_ENCODING")]
    + [("torch.distributed.checkpoint.filesystem", "_StorageInfo"),
       ("torch.serialization", "_get_layout"),  # maps a layout's name ("torch.strided") to the layout
       ("torch", "Size"), ("torch", "device"),
       ("collections", "OrderedDict")]
    + [("pathlib", name) for name in ("PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath")]
    + [("torch", name) for name, value in vars(torch).items() if isinstance(value, torch.dtype)]
)


class _MetadataUnpickler(pickle.Unpickler):
    """Unpickles DCP's `.metadata`, resolving only the globals on `ALLOWED_GLOBALS`."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED_GLOBALS:
            return super().find_class(module, name)
        raise FormatError(f"checkpoint metadata refers to {module}.{name}, which is not allowed (a checkpoint "
                          f"written by the trainer never names it); nothing was loaded: a damaged or hostile folder?")


class SafeReader(FileSystemReader):
    def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
        path = os.path.join(str(self.path), ".metadata")
        with open(path, "rb") as f:
            data = f.read()
        try:
            metadata = _MetadataUnpickler(io.BytesIO(data)).load()
        except FormatError:
            raise
        except Exception as e:  # any malformed pickle: truncated, wrong opcodes, wrong arguments
            raise FormatError(f"{path}: unreadable checkpoint metadata ({type(e).__name__}: {e}); resume from "
                              f"an earlier checkpoint (checkpoint.resume=FOLDER) or start afresh") from None
        if not isinstance(metadata, Metadata):
            raise FormatError(f"{path}: holds a {type(metadata).__name__}, not checkpoint metadata; resume from "
                              f"an earlier checkpoint (checkpoint.resume=FOLDER) or start afresh")
        if getattr(metadata, "storage_meta", None) is not None:
            metadata.storage_meta.load_id = self.load_id
        return metadata


class SafePlanner(DefaultLoadPlanner):
    def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
        obj = torch.load(value, weights_only=True)
        if self.flatten_state_dict:
            from torch.distributed.checkpoint._nested_dict import set_element

            set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
        else:
            self.state_dict[read_item.dest_index.fqn] = obj


# --- RNG ----------------------------------------------------------------------------------------
def rng_state(device: torch.device) -> dict[str, Any]:
    np_state = np.random.get_state()
    py_state = random.getstate()
    return {
        "torch": torch.get_rng_state().tolist(),
        "cuda": torch.cuda.get_rng_state(device).tolist() if device.type == "cuda" else None,
        "numpy": [np_state[0], np_state[1].tolist(), int(np_state[2]), int(np_state[3]), float(np_state[4])],
        "python": [py_state[0], list(py_state[1]), py_state[2]],
    }


def set_rng_state(state: dict[str, Any], device: torch.device) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if device.type == "cuda" and state.get("cuda") is not None:
        torch.cuda.set_rng_state(torch.tensor(state["cuda"], dtype=torch.uint8), device)
    n = state["numpy"]
    np.random.set_state((n[0], np.array(n[1], dtype=np.uint32), n[2], n[3], n[4]))
    p = state["python"]
    random.setstate((p[0], tuple(p[1]), p[2]))


def _write_json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f)
        f.flush()
        os.fsync(f.fileno())


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns that a single process saves without a process group; that is the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _barrier(d: Dist) -> None:
    if d.world_size > 1:
        dist.barrier()


class Checkpointer:
    """Saves and loads checkpoints under `root`, keeping the newest `keep` complete ones."""

    def __init__(self, root: str, keep: int, d: Dist):
        self.root, self.keep, self.d = root, keep, d
        self.run_id: str | None = uuid.uuid4().hex[:16]  # a new run's; `begin` takes a resumed run's
        if root and d.is_main:  # said now, not at the first save after hours of training
            try:
                os.makedirs(root, exist_ok=True)
                probe = tempfile.NamedTemporaryFile(dir=root, prefix=".write-check-")
                probe.close()
            except OSError as e:
                raise ConfigError(f"checkpoint.dir = {root!r}: cannot write checkpoints there ({e.strerror or e}); "
                                  f"choose another folder") from None

    def begin(self, resume: str, replace: bool = False, say: Callable[[str], None] = print) -> str | None:
        """The checkpoint this run starts from (None: a new run), once `root` holds only this run's history:
        another run's checkpoints there, or this run's later than the one it resumes from, are a ConfigError
        naming them, or with `replace` deleted (every rank calls this; the main one deletes)."""
        resumed = resolve_resume(self.root, resume)
        if resumed is not None:
            self.run_id = run_of(resumed)
        found = _not_ours(self.root, resumed, self.run_id) if self.root else None
        if found and not replace:
            raise ConfigError(f"checkpoint.dir = {self.root!r} holds {found[1]}, set checkpoint.replace = true "
                              f"to delete them, or choose another checkpoint.dir")
        if found and self.d.is_main:
            for _, path in found[2]:
                try:
                    shutil.rmtree(path)
                except OSError as e:
                    raise ConfigError(f"checkpoint.replace = true: cannot delete {path} ({e.strerror or e}); "
                                      f"delete it yourself or choose another checkpoint.dir") from None
            say(f"checkpoint.replace = true: deleted {found[0]} checkpoints in {self.root}: {_names(found[2])}")
        if replace and self.root:  # every rank (whatever it found while the main one deleted) waits for that
            _barrier(self.d)
        return resumed

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, state: dict[str, Any]) -> str:
        """Write checkpoint `step` atomically (all ranks call this); returns its folder."""
        d = self.d
        final = os.path.join(self.root, checkpoint_name(step))
        tmp = final + ".tmp"
        if d.is_main:
            shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a killed save
            os.makedirs(tmp)
        _barrier(d)
        model_sd, optim_sd = get_state_dict(model, optimizer)
        with _quiet():
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=tmp, no_dist=d.world_size == 1)
        _write_json(os.path.join(tmp, f"rng-rank{d.rank:05d}.json"), rng_state(d.device))
        _barrier(d)
        if d.is_main:
            _write_json(os.path.join(tmp, STATE_FILE),
                        {"version": STATE_VERSION, "step": step, "world_size": d.world_size, "run_id": self.run_id,
                         **state})
            if os.path.exists(final):  # the same step saved again (e.g. after a rollback): replace it
                shutil.rmtree(final)
            os.rename(tmp, final)
            fd = os.open(self.root, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
            ours = [p for _, p in complete_checkpoints(self.root) if run_of(p) == self.run_id]
            for old in ours[: -self.keep]:  # this run's only: never another's, which `begin` refused or replaced
                shutil.rmtree(old, ignore_errors=True)
        _barrier(d)
        return final

    def load(self, path: str, model: nn.Module, optimizer: torch.optim.Optimizer,
             expect_model: dict[str, Any] | None = None) -> dict[str, Any]:
        """Restore model, optimizer and (same world size) this rank's RNG; returns the trainer state.

        `expect_model` (the model's settings) must match the saved ones, else a ConfigError names the difference.
        """
        d = self.d
        try:
            with open(os.path.join(path, STATE_FILE)) as f:
                state = json.load(f)
        except (OSError, ValueError) as e:
            raise FormatError(f"{path}: cannot read {STATE_FILE} ({e})") from None
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            found = state.get("version") if isinstance(state, dict) else type(state).__name__
            raise FormatError(f"{path}: trainer state version {found} is not {STATE_VERSION}")
        _check_state(path, state)
        saved = state.get("model")
        if expect_model is not None and saved is not None:
            diff = [f"{k}: {saved.get(k)} -> {v}" for k, v in expect_model.items() if saved.get(k) != v]
            if diff:
                raise ConfigError(f"cannot resume from {path}: the model differs from the checkpoint's "
                                  f"({'; '.join(diff)}); restore those settings or start a new checkpoint.dir")
        saved_keys = set(SafeReader(path).read_metadata().state_dict_metadata)  # its one-line FormatError first
        model_sd, optim_sd = get_state_dict(model, optimizer)
        target = {"model": model_sd, "optim": optim_sd}
        own_groups = [list(g["params"]) for g in optim_sd.get("param_groups", [])]
        renamed = _read_tied_from_original(target, saved_keys)
        try:
            with _quiet():
                dcp.load(target, checkpoint_id=path, storage_reader=SafeReader(path), planner=SafePlanner(),
                         no_dist=d.world_size == 1)
        except (FormatError, KeyboardInterrupt, SystemExit):
            raise
        except BaseException as e:  # noqa: BLE001  (DCP's CheckpointException, a BaseException, wraps each rank's)
            said = [line for line in str(e).strip().splitlines() if line and not line.startswith((" ", "Traceback"))]
            first = (said[-1] if said else type(e).__name__)[:200]
            older = [p for _, p in complete_checkpoints(os.path.dirname(path)) if p != path]
            hint = f'set checkpoint.resume = "{older[-1]}"' if older else 'set checkpoint.resume = "none"'
            raise FormatError(f"{path}: its tensors cannot be read ({first}); the checkpoint is "
                              f"damaged: {hint} to start from {'the one before' if older else 'scratch'}") from None
        for section, copy, original in renamed:
            holder = target["model"] if section == "model" else target["optim"]["state"]
            holder[copy] = holder.pop(original)
        for group, own in zip(target["optim"].get("param_groups", []), own_groups):
            group["params"] = own  # the saved layout's names of its stage's parameters: this one's instead
        set_state_dict(model, optimizer, model_state_dict=target["model"], optim_state_dict=target["optim"])
        rng_file = os.path.join(path, f"rng-rank{d.rank:05d}.json")
        if state.get("world_size") == d.world_size and os.path.isfile(rng_file):
            with open(rng_file) as f:
                set_rng_state(json.load(f), d.device)
            state["rng_restored"] = True
        else:  # a different world size: RNG streams cannot map one to one, reseed per (seed, rank, step)
            state["rng_restored"] = False
        return state


# a pipeline's last stage holds its own copy of the tied matrix (kept equal to the first stage's): copy -> original
TIED_COPIES = {"lm_head.weight": "tok_emb.weight"}


def _read_tied_from_original(target: dict[str, Any], saved_keys: set[str]) -> list[tuple[str, str, str]]:
    """Resharding between layouts with and without pipeline stages: a tied copy (model weight or optimizer state)
    that the checkpoint lacks is read from its original's entries (a 1-process run saves the tied matrix's
    optimizer state once, as tok_emb.weight). Returns the (section, copy, original) renamed in `target`."""
    renamed = []
    model_sd, optim_state = target["model"], target["optim"].get("state", {})
    for copy, original in TIED_COPIES.items():
        if copy in model_sd and original not in model_sd and f"model.{copy}" not in saved_keys \
                and f"model.{original}" in saved_keys:
            model_sd[original] = model_sd.pop(copy)
            renamed.append(("model", copy, original))
        if copy in optim_state and original not in optim_state \
                and not any(k.startswith(f"optim.state.{copy}.") for k in saved_keys) \
                and any(k.startswith(f"optim.state.{original}.") for k in saved_keys):
            optim_state[original] = optim_state.pop(copy)
            renamed.append(("optim", copy, original))
    return renamed


def _check_state(path: str, state: dict[str, Any]) -> None:
    """A trainer state of the wrong shape is one clear error, not a KeyError deep in the loop."""
    counters = state.get("counters")
    problems = [k for k, kind in (("step", int), ("world_size", int), ("loader", dict), ("counters", dict))
                if not isinstance(state.get(k), kind) or isinstance(state.get(k), bool)]
    if isinstance(counters, dict):
        problems += [f"counters.{k}" for k in ("skipped", "bad_in_row", "tokens") if not isinstance(counters.get(k), int)]
        if "loss_ema" not in counters or not isinstance(counters["loss_ema"], (int, float, type(None))):
            problems.append("counters.loss_ema")
    if problems:
        raise FormatError(f"{path}/{STATE_FILE}: missing or malformed {', '.join(problems)}; the checkpoint is "
                          f"damaged: resume from an earlier one (checkpoint.resume=FOLDER) or start afresh")
