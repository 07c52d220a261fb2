"""The audit report as text: one line per epoch, each resume, and each finding with what to look at."""

from __future__ import annotations

import time
from typing import Any

from dataflow.sizes import count


def _when(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t))


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks)) if ranks else "no rank"


def describe_resume(r: dict[str, Any]) -> str:
    """`resume #2 (load_state_dict at epoch 0, position 640, state 3fa2..., 3 ranks, 2 workers, at ...)`."""
    text = (f"resume #{r['number']} ({r['via']} at epoch {r['epoch']}, position {r['consumed']:,}, state "
            f"{r['state']}, {count(r['world_size'], 'rank')}, {count(r['workers'], 'worker')}, {_when(r['t'])})")
    stop = r.get("stopped_at")
    if stop and (stop["epoch"], stop["consumed"]) != (r["epoch"], r["consumed"]):
        text += f"; the run had stopped cleanly at epoch {stop['epoch']}, position {stop['consumed']:,}"
    return text


def describe_finding(f: dict[str, Any]) -> str:
    every = f", every {f['stride']}" if f["stride"] > 1 else ""
    span = f"epoch {f['epoch']} positions {f['start']:,}-{f['stop'] - 1:,} ({count(f['samples'], 'sample')}{every})"
    if f["kind"] == "duplicate":
        text = f"DUPLICATE {span} served {f['times']} times, by {_ranks(f['ranks'])}"
        after = ", after " if f["resume"] else ""
    else:
        text = f"MISSING {span} never served ({_ranks(f['ranks'])} had them in their plan)"
        after = ", skipped by " if f["resume"] else "; their records are lost (a kill before they were written?)"
    return text + (after + describe_resume(f["resume"]) if f["resume"] else after)


def format_report(report: dict[str, Any]) -> str:
    lines = [f"audit of {report['folder']}: {count(len(report['files']), 'file')}, "
             f"{count(report['sessions'], 'session')}"]
    for d in report["datasets"]:
        lines.append(f"dataset {d['dataset']} ({count(d['samples_per_epoch'], 'sample')} an epoch), "
                     f"{_ranks(d['ranks'])}, {count(len(d['resumes']), 'resume')}"
                     + (f", {count(d['replayed'], 'position')} replayed after a crash" if d["replayed"] else ""))
        for r in d["resumes"]:
            lines.append(f"  {describe_resume(r)}")
        for e in d["by_epoch"]:
            lines.append(f"  epoch {e['epoch']}: {_epoch_line(e)}")
    for u in report["unreadable"][:5]:
        lines.append(f"  unreadable: {u['file']} line {u['line']}: {u['why']}")
    for f in report["findings"]:
        lines.append(describe_finding(f))
    lines.append("clean: every sample of each epoch was served exactly once" if report["clean"] else
                 f"NOT CLEAN: {count(len(report['findings']), 'finding')}")
    return "\n".join(lines)


def _epoch_line(e: dict[str, Any]) -> str:
    text = f"{e['served']:,} of {e['samples']:,} samples served"
    if e["complete"]:
        text += f", complete ({e['dropped']:,} in the drop-last tail)"
    else:
        text += ", unfinished"
    if e["first"]:
        text += f"; records begin at position {e['first']:,}"
    if e["duplicated"] or e["missing"]:
        text += f"; {e['duplicated']:,} duplicated, {e['missing']:,} missing"
    return text
