"""The slot ring: page-aligned batch buffers in one shared-memory segment, and the leases of lent slots.

`WorkerPool` (handoff.py) allocates one before its workers start; workers fill slots through
`numpy_views`, the main process hands them out through `lend` (views watched by a `_Lease`) or `copy`.
"""

from __future__ import annotations

import itertools
import math
import os
import weakref
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np
import torch

from dataflow.debug import cause
from dataflow.errors import ConfigError
from dataflow.loading.contract import BatchLayout

PAGE = 4096
SHM = "/dev/shm"  # where torch's shared tensors live on Linux (both of its sharing strategies)


@dataclass(frozen=True)
class Field:
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    offset: int  # within a slot


def slots_per_worker(ready_ahead: int, held: int, num_workers: int) -> int:
    """The ring's sizing rule: each worker keeps `ready_ahead` (the loader's prefetch_factor) batches ready,
    holds its share of the `held` batches the consumer keeps at once, and fills one more."""
    return ready_ahead + math.ceil(held / num_workers) + 1


def slot_bytes(layout: BatchLayout) -> int:
    """Bytes of one slot of `layout` (field name -> (shape, dtype)): each field starts on a page."""
    return max(sum(_field_bytes(shape, dtype) for shape, dtype in layout.values()), PAGE)


def _fields(layout: BatchLayout) -> list[Field]:
    fields, offset = [], 0
    for name, (shape, dtype) in layout.items():
        dtype = np.dtype(dtype)
        fields.append(Field(name, tuple(shape), dtype, offset))
        offset += _field_bytes(shape, dtype)
    return fields


def _field_bytes(shape: tuple[int, ...], dtype: Any) -> int:
    return _round_up(int(np.prod(shape)) * np.dtype(dtype).itemsize, PAGE)


class SlotRing:
    """`slots` buffers of one batch layout in a single shared, page-aligned segment."""

    def __init__(self, layout: BatchLayout, slots: int, workers: int = 1):
        self.fields = _fields(layout)
        self.slot_bytes = slot_bytes(layout)
        self.slots = slots
        self.buffer = self._allocate(workers)
        self.pinned = False
        self._numpy: list[dict[str, np.ndarray]] | None = None

    def _allocate(self, workers: int) -> torch.Tensor:
        """The shared segment; a /dev/shm too small for it is one line saying what took the space and what
        to change, checked before allocating (an overcommitted tmpfs would SIGBUS a worker later)."""
        need = self.slot_bytes * self.slots
        free = shm_free()
        if free is not None and need > free:
            raise self._too_big(need, free, workers)
        try:
            return torch.empty(need, dtype=torch.uint8).share_memory_()
        except RuntimeError as e:  # "unable to allocate shared memory(shm) for file <...>: No space left ..."
            raise self._too_big(need, shm_free(), workers, e) from cause(e)

    def _too_big(self, need: int, free: int | None, workers: int, e: BaseException | None = None) -> ConfigError:
        f = self.fields[0]
        shape = " x ".join(str(n) for n in f.shape)
        what = "batch_size x seq_len" if len(f.shape) == 2 else "the batch shape"
        got = f"{_mb(free)} is free" if free is not None else "it could not be allocated"
        told = "" if e is None else f" ({str(e).strip().splitlines()[0]})"
        size_gb = max(1, math.ceil(need * 1.25 / 2**30))
        return ConfigError(
            f"the loader's batch ring needs {_mb(need)} of shared memory ({SHM}) and {got}{told}: {what} "
            f"{shape} x {len(self.fields)} fields ({', '.join(g.name for g in self.fields)}) x {f.dtype.itemsize} "
            f"bytes = {_mb(self.slot_bytes)} a batch, x {self.slots // max(workers, 1)} batches per worker "
            f"(prefetch_factor + held_batches / num_workers + 1) x {workers} workers. Lower num_workers, "
            f"held_batches or prefetch_factor, use a smaller batch_size, or give the machine more shared memory "
            f"(Docker: --shm-size={size_gb}g; Kubernetes: a memory-backed emptyDir at {SHM})")

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_numpy"] = None
        state["pinned"] = False
        return state

    def numpy_views(self, slot: int) -> dict[str, np.ndarray]:
        """The slot's fields as numpy arrays (what a worker fills)."""
        if self._numpy is None:
            flat = self.buffer.numpy()
            self._numpy = [{f.name: flat[s * self.slot_bytes + f.offset:][:int(np.prod(f.shape)) * f.dtype.itemsize]
                            .view(f.dtype).reshape(f.shape) for f in self.fields} for s in range(self.slots)]
        return self._numpy[slot]

    def lend(self, slot: int, rows: int, on_release: Callable[[], None]) -> tuple[dict[str, torch.Tensor], "_Lease"]:
        """Tensors viewing the slot's first `rows` rows, and the lease that runs `on_release()` once none
        of them (nor any view of them) is referenced any more."""
        arrays = [v.view() if rows == v.shape[0] else v[:rows] for v in self.numpy_views(slot).values()]
        lease = _Lease(arrays, on_release)
        return {f.name: torch.from_numpy(a) for f, a in zip(self.fields, arrays)}, lease

    def copy(self, slot: int, rows: int) -> dict[str, torch.Tensor]:
        """An owned copy of the slot's first `rows` rows (page-locked like the ring when it is pinned)."""
        out = {}
        for name, view in self.numpy_views(slot).items():
            src = torch.from_numpy(view[:rows])
            out[name] = torch.empty_like(src, pin_memory=self.pinned).copy_(src)
        return out

    def pin(self) -> None:
        """Page-lock the ring so host-to-device copies from it are truly asynchronous."""
        if not self.pinned and torch.cuda.is_available():
            err = torch.cuda.cudart().cudaHostRegister(self.buffer.data_ptr(), self.buffer.numel(), 0)
            self.pinned = int(getattr(err, "value", err)) == 0

    def unpin(self) -> None:
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.buffer.data_ptr())
            self.pinned = False


class _Lease:
    """Watches the fresh numpy arrays a lent slot's tensors were made from (each tensor, and every view of
    it, keeps its array alive): when the last one is gone, `on_release()` runs, once, in whatever thread
    dropped it. The pool holds the lease until then (its weak references must outlive the arrays)."""

    __slots__ = ("_refs", "_drops", "_n", "_on_release")

    def __init__(self, arrays: list[np.ndarray], on_release: Callable[[], None]):
        self._on_release, self._n = on_release, len(arrays)
        self._drops = itertools.count(1)  # next() is atomic: two threads dropping fields cannot both miss
        self._refs = [weakref.ref(a, self._dropped) for a in arrays]

    def _dropped(self, _ref: Any) -> None:
        if next(self._drops) == self._n:
            self._on_release()


def shm_free() -> int | None:
    """Bytes free in /dev/shm, or None where there is none to measure."""
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def _mb(n: int) -> str:
    return f"{n / 2**30:.1f} GB" if n >= 2**30 else f"{n / 2**20:.1f} MB"


def _round_up(n: int, to: int) -> int:
    return (n + to - 1) // to * to
