"""`RankLog`: one rank's starvation figures, appended to `RUN_DIR/rank-R.jsonl` at log intervals.

`StarvationMonitor(run_dir=DIR)` makes one; at the end of a step, once `every_s` seconds have passed since
the last record, it appends one line for the interval: its steps, wall, data wait, step time, whether it
ends inside the warm-up, and the pipeline's running stage seconds. No collective, one `os.write` per
interval; `dataflow profile --fleet DIR` reads every rank's file (`fleet.py`).
"""

from __future__ import annotations

import json
import os
import socket
import time
from typing import Any

from dataflow.errors import ConfigError

EVERY_S = 10.0


def rank_world() -> tuple[int, int]:
    """torch.distributed's (rank, world size) when it is initialised, else the launcher's RANK/WORLD_SIZE, else (0, 1)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))


class RankLog:
    """Appends this rank's interval figures; `record(mon, now)` is called by the monitor."""

    def __init__(self, run_dir: str | os.PathLike, warmup_steps: int, every_s: float = EVERY_S):
        self.rank, self.world = rank_world()
        self.every_s, self.next_t = float(every_s), 0.0
        self.path = os.path.join(os.fspath(run_dir), f"rank-{self.rank}.jsonl")
        try:
            os.makedirs(os.fspath(run_dir), exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as e:
            raise ConfigError(f"StarvationMonitor run_dir={run_dir}: cannot append to {self.path} "
                              f"({e.strerror or e}); pass a writable folder") from None
        self._last: tuple[float, float, float, int, int] | None = None  # (clock, wait, step, steps, batches)
        self._write({"kind": "rank", "rank": self.rank, "world_size": self.world, "host": socket.gethostname(),
                     "pid": os.getpid(), "t": time.time(), "warmup_steps": warmup_steps})

    def record(self, mon: Any, now: float) -> None:
        """One interval's figures, from the monitor's running totals."""
        wait = mon.total_wait + (mon.cuda.copy_wait_total if mon.cuda is not None else 0.0)
        start = self._last or (mon._start if mon._start is not None else now, 0.0, 0.0, 0, 0)
        self._last = (now, wait, mon.total_step, mon.count, mon.batches)
        self.next_t = now + self.every_s
        if mon.count == start[3] and mon.batches == start[4]:
            return
        stages = mon.probe.totals() if mon.probe is not None else {}
        self._write({"kind": "interval", "t": time.time(), "steps": [start[3], mon.count], "wall_s": now - start[0],
                     "wait_s": wait - start[1], "step_s": mon.total_step - start[2],
                     "warmup": start[3] < mon.warmup_steps, "stages": {k: round(v, 6) for k, v in stages.items()}})

    def _write(self, record: dict[str, Any]) -> None:
        try:
            os.write(self._fd, (json.dumps(record, separators=(",", ":")) + "\n").encode())
        except OSError:
            pass  # figures are best effort: a full disk never stops training

    def close(self) -> None:
        try:
            os.close(self._fd)
        except OSError:
            pass
