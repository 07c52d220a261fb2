"""Running one tool in a subprocess while sampling the memory of its whole process tree (PSS)."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import threading
import time


def _children(pid: int) -> list[int]:
    out = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out += [int(x) for x in f.read().split()]
    except OSError:
        pass
    return out


def _pss_kb(pid: int) -> int:
    """Proportional set size: shared pages (shared memory, mapped files) are split between the processes
    mapping them, so the sum over a process tree counts each page once."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Pss:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def tree_pss_mb(root: int) -> float:
    todo, total, seen = [root], 0, set()
    while todo:
        pid = todo.pop()
        if pid in seen:
            continue
        seen.add(pid)
        total += _pss_kb(pid)
        todo += _children(pid)
    return total / 1024


def run_measured(cmd: list[str], timeout: float, env: dict | None = None, interval: float = 0.25) -> dict:
    """Runs cmd; returns rc, wall_s, peak_mb (peak PSS of the process tree) and the tail of stderr."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env, text=True)
    peak = [0.0]
    stop = threading.Event()

    def sample():
        while not stop.wait(interval):
            peak[0] = max(peak[0], tree_pss_mb(proc.pid))

    th = threading.Thread(target=sample, daemon=True)
    th.start()
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc = proc.returncode
    except subprocess.TimeoutExpired:
        for pid in [proc.pid] + _children(proc.pid):  # only the processes this run started
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        out, _ = proc.communicate()
        rc = "timeout"
    stop.set()
    th.join()
    return {"rc": rc, "wall_s": time.perf_counter() - t0, "peak_mb": peak[0], "log": (out or "")[-4000:]}


def run_case(cmd: list[str], out: str, timeout: float, env: dict | None = None) -> dict:
    """Runs one harness case that writes its result JSON to `out`; returns that result plus peak_mb, or
    {"error": why, "peak_mb": ...} when it timed out or failed without saying why itself."""
    for stale in (out, out + ".hashes.json"):
        if os.path.exists(stale):
            os.remove(stale)
    r = run_measured(cmd, timeout, env)
    res = {}
    if os.path.exists(out):
        with open(out) as f:
            res = json.load(f)
    if r["rc"] == "timeout":
        res = {"error": f"timed out after {timeout:.0f} s"}
    elif r["rc"] != 0 and "error" not in res:
        res = {"error": f"exit {r['rc']}: {last_error(r['log'])}"}
    return {**res, "peak_mb": r["peak_mb"]}


def last_error(log: str) -> str:
    lines = [x.strip() for x in log.strip().splitlines() if x.strip()]
    for x in reversed(lines):
        if "Error" in x or "error" in x or "Exception" in x:
            return x[:300]
    return lines[-1][:300] if lines else "no output"


def machine() -> dict:
    model = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        for line in out.splitlines():
            if line.startswith("Model name:"):
                model = line.split(":", 1)[1].strip()
    except OSError:
        pass
    with open("/proc/meminfo") as f:
        mem = int(f.readline().split()[1]) / 1024 ** 2
    return {"cpu": model, "cores": os.cpu_count(), "ram_gib": round(mem, 1),
            "python": platform.python_version(), "kernel": platform.release()}


def run_forked(worker, setting, texts: list, workers: int) -> list:
    """`worker(setting, texts[i::n], barrier, out)` in n forked processes (the texts are shared, not sent:
    no IPC is timed); each puts one result on `out`. Returns the results, in the order they came."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    n = max(workers, 1)
    barrier, out = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=worker, args=(setting, texts[i::n], barrier, out)) for i in range(n)]
    for p in procs:
        p.start()
    parts = [out.get() for _ in procs]
    for p in procs:
        p.join()
    return parts
