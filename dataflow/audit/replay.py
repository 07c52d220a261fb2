"""`audit_folder(DIR)`: replay the loaders' records and say whether each epoch served every sample once.

A position is a global sample position of an epoch, 0 <= p < samples (the cursor's `consumed` counts
them; the epoch order of `shuffle.py` maps them one-to-one to samples, so once per position is once per
sample). Records are replayed in time order over all ranks, and a tally per epoch counts how often each
position was yielded. The rules:

- A resume (a walk that did not continue where the last one stood: `load_state_dict`, `set_epoch`, a
  new process) after sessions that stopped without a clean end (a kill, a crash) rolls those back: what
  they served at or after the resumed position was lost with the model's unsaved steps and is served
  again, legitimately (counted as `replayed`). Sessions that stopped cleanly are never rolled back: a
  resume from an older state than where they stood serves their last steps twice (a stale state).
- An epoch that reached its end expects every position below its drop-last tail (`plan.py`: the last
  `(samples - consumed) % world` positions, and with `drop_last` the partial batch of each rank, are not
  served; the loader records where that tail begins). An unfinished epoch expects every position below
  the furthest one the fleet reached (ranks step together: a step one rank recorded, all served).
- Positions before the first record of the folder (a run resumed into a fresh folder) are not judged.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dataflow.audit.read import Session, read_folder

FINDINGS_PER_EPOCH = 10  # ranges named per kind and epoch (the counts cover all)


@dataclass
class _Served:
    """One `steps` record as applied to the tally (its range shrinks when rolled back)."""

    record: dict[str, Any]
    session: Session
    start: int
    stop: int
    stride: int
    at: int
    tail: int | None

    @property
    def rank(self) -> int:
        return self.record["layout"][0]

    def covers(self, a: int, b: int) -> bool:
        """Whether any of its positions lies in [a, b)."""
        first = self.start if self.start >= a else self.start + -(-(a - self.start) // self.stride) * self.stride
        return first < min(self.stop, b)


@dataclass
class _Tally:
    samples: int
    counts: dict[int, np.ndarray] = field(default_factory=dict)
    served: dict[int, list[_Served]] = field(default_factory=dict)
    resumes: list[dict[str, Any]] = field(default_factory=list)
    replayed: int = 0
    begin: tuple[int, int] | None = None  # (epoch, position) of the folder's first record

    def epoch(self, e: int) -> np.ndarray:
        if e not in self.counts:
            self.counts[e] = np.zeros(self.samples, np.uint16)  # 2 bytes a position: a billion samples, 2 GB
            self.served[e] = []
        return self.counts[e]


def audit_folder(path: str) -> dict[str, Any]:
    """The audit report of the folder (see the module docstring); `clean` when no finding."""
    folder = read_folder(path)
    groups: dict[tuple, list[Session]] = {}
    for s in folder.sessions:
        groups.setdefault(s.key, []).append(s)
    datasets = [_audit_group(key, sessions) for key, sessions in groups.items()]
    findings = [f for d in datasets for f in d.pop("findings")]
    return {"folder": path, "clean": not findings, "epochs": sum(len(d["by_epoch"]) for d in datasets),
            "samples": sum(e["served"] for d in datasets for e in d["by_epoch"]), "findings": findings,
            "files": folder.files, "sessions": len(folder.sessions), "unreadable": folder.unreadable,
            "datasets": datasets}


def _audit_group(key: tuple, sessions: list[Session]) -> dict[str, Any]:
    tally = _Tally(samples=int(key[2]))
    walks = {(s.header["session"], r["walk"]): (s, r) for s in sessions for r in s.records if r["kind"] == "walk"}
    events = sorted(((r["t"], s.order, i, s, r) for s in sessions for i, r in enumerate(s.records)
                     if r["kind"] in ("walk", "steps")), key=lambda e: e[:3])
    for _, _, _, session, record in events:
        if record["kind"] == "walk":
            _walk(tally, session, record, sessions)
        else:
            _apply(tally, session, record)
    by_epoch, findings = [], []
    for e in sorted(tally.counts):
        summary, found = _judge(tally, e, walks)
        by_epoch.append(summary)
        findings += [dict(f, dataset=key[0], resume=_public(tally.resumes, f["resume"])) for f in found]
    return {"dataset": key[0], "seed": key[1], "samples_per_epoch": key[2], "seq_len": key[3],
            "ranks": sorted({s.header["rank"] for s in sessions}), "sessions": len(sessions),
            "resumes": tally.resumes, "replayed": tally.replayed, "by_epoch": by_epoch, "findings": findings}


def _walk(tally: _Tally, session: Session, record: dict[str, Any], sessions: list[Session]) -> None:
    """A walk starts: the first of the folder marks where the records begin; a resume rolls back the
    unsaved steps of sessions that died before it, and is noted (ranks resuming together, once)."""
    e, c, via = record["epoch"], record["consumed"], record["via"]
    if tally.begin is None:
        tally.begin = (e, c)
    ended = any(s is not session and s.last_t < record["t"] for s in sessions)
    if via == "continue" or (via == "start" and (e, c) == tally.begin and not ended):
        return  # serving on, or the run's own start (no session had stopped yet)
    record["reached"] = max([s.at for s in tally.served.get(e, []) if s.start < s.stop] or [0])
    for s in sessions:
        if s is not session and not s.clean and s.last_t < record["t"]:
            _roll_back(tally, s, e, c)
    last = tally.resumes[-1] if tally.resumes else None
    same = last is not None and (last["via"], last["epoch"], last["consumed"], last["world_size"]) == (
        via, e, c, record["layout"][1]) and session.header["rank"] not in last["ranks"]
    if same:
        last["ranks"].append(session.header["rank"])
    else:
        stopped = [s.records[-1] for s in sessions if s.clean and s.last_t < record["t"]]
        tally.resumes.append({"number": len(tally.resumes) + 1, "via": via, "epoch": e, "consumed": c,
                              "state": record.get("state"), "world_size": record["layout"][1],
                              "workers": record["layout"][2], "t": record["t"], "ranks": [session.header["rank"]],
                              "stopped_at": _furthest(stopped)})
    record["resume"] = tally.resumes[-1]["number"]


def _public(resumes: list[dict[str, Any]], n: int | None) -> dict[str, Any] | None:
    """The resume numbered `n`, as a finding names it."""
    return None if n is None else dict(resumes[n - 1], ranks=sorted(resumes[n - 1]["ranks"]))


def _furthest(ends: list[dict[str, Any]]) -> dict[str, int] | None:
    """The furthest (epoch, position) among clean stops (where a correct resume continues)."""
    if not ends:
        return None
    e = max(ends, key=lambda r: (r["epoch"], r["consumed"]))
    return {"epoch": e["epoch"], "consumed": e["consumed"]}


def _apply(tally: _Tally, session: Session, record: dict[str, Any]) -> None:
    start, stop, stride = record["pos"]
    e = record["epoch"]
    tally.epoch(e)[start:stop:stride] += 1
    tally.served[e].append(_Served(record, session, start, stop, stride, record["at"], record.get("tail")))


def _roll_back(tally: _Tally, session: Session, epoch: int, position: int) -> None:
    """Take out what `session` served at or after (epoch, position): replayed by the resume there."""
    for e, served in tally.served.items():
        if e < epoch:
            continue
        for s in served:
            if s.session is not session or s.start >= s.stop:
                continue
            cut = s.start if e > epoch or s.start >= position else \
                s.start + -(-(position - s.start) // s.stride) * s.stride
            if cut >= s.stop:
                continue
            tally.counts[e][cut:s.stop:s.stride] -= 1
            tally.replayed += len(range(cut, s.stop, s.stride))
            s.stop, s.tail, s.at = cut, None, min(s.at, position if e == epoch else 0)


def _runs(idx: np.ndarray) -> list[tuple[int, int, int]]:
    """Sorted positions -> maximal (start, stop, stride) progressions: one rank's lost share is one range."""
    if len(idx) < 2:
        return [(int(idx[0]), int(idx[0]) + 1, 1)] if len(idx) else []
    d = np.diff(idx)
    out, i = [], 0
    for j in [int(k) + 1 for k in np.flatnonzero(np.diff(d) != 0)] + [len(d)]:  # runs of equal gaps d[i:j]
        if i < j:
            out.append((int(idx[i]), int(idx[j]) + 1, int(d[i])))
            i = j + 1  # the run's last position is taken; the next run starts after it
    if i == len(idx) - 1:
        out.append((int(idx[i]), int(idx[i]) + 1, 1))
    return out


def _judge(tally: _Tally, e: int, walks: dict) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One epoch's summary and findings."""
    counts, served = tally.counts[e], [s for s in tally.served[e] if s.start < s.stop]
    tails = [s.tail for s in served if s.tail is not None]
    end = max(tails) if tails else max([s.at for s in served] or [0])
    begin = tally.begin[1] if tally.begin and tally.begin[0] == e else 0
    doubled = np.flatnonzero(counts > 1)
    lost = np.flatnonzero(counts[begin:end] == 0) + begin
    summary = {"epoch": e, "samples": tally.samples, "served": int(np.count_nonzero(counts)),
               "complete": bool(tails), "dropped": tally.samples - end if tails else None,
               "first": begin, "duplicated": int(len(doubled)), "missing": int(len(lost))}
    found = [_duplicate(e, run, served, walks, counts) for run in _runs(doubled)[:FINDINGS_PER_EPOCH]]
    found += [_missing(e, run, walks, tally) for run in _runs(lost)[:FINDINGS_PER_EPOCH]]
    return summary, sorted(found, key=lambda f: f["start"])


def _duplicate(e: int, run: tuple[int, int, int], served: list[_Served], walks: dict,
               counts: np.ndarray) -> dict[str, Any]:
    """The run served more than once: by which ranks, and after which resume (that of the latest serving)."""
    a, b, stride = run
    covering = [s for s in served if s.covers(a, b)]
    latest = max(covering, key=lambda s: s.record["t"])
    return {"kind": "duplicate", "epoch": e, "start": a, "stop": b, "stride": stride,
            "samples": len(range(a, b, stride)), "times": int(counts[a:b:stride].max()),
            "ranks": sorted({s.rank for s in covering}), "resume": _resume_of(latest, walks)}


def _resume_of(s: _Served, walks: dict) -> int | None:
    """The resume that the walk of `s` follows: its own start, or the latest earlier one of its session."""
    sid, n = s.record["session"], s.record["walk"]
    for k in range(n, 0, -1):
        found = walks.get((sid, k))
        if found is not None and "resume" in found[1]:
            return found[1]["resume"]
    return None


def _missing(e: int, run: tuple[int, int, int], walks: dict, tally: _Tally) -> dict[str, Any]:
    """[a, b) never served: the ranks whose plans held some of it, and the resume that jumped past it, if one did."""
    a, b, stride = run
    positions = np.arange(a, min(b, a + 1000 * stride), stride)  # enough to name the ranks
    ranks, jumped = set(), []
    for session, w in walks.values():
        if w["epoch"] != e:
            continue
        r, world, c = w["layout"][0], w["layout"][1], w["consumed"]
        per_rank = min(w["batches"] * session.header["batch_size"], (tally.samples - c) // world)
        rel = positions - c - r
        if np.any((rel >= 0) & (rel % world == 0) & (rel // world < per_rank)):
            ranks.add(r)
        if c > a and "resume" in w and w["reached"] <= a:  # it started past all that was served before it
            jumped.append((c, w["t"], w["resume"]))
    return {"kind": "missing", "epoch": e, "start": a, "stop": b, "stride": stride,
            "samples": len(range(a, b, stride)), "ranks": sorted(ranks),
            "resume": min(jumped)[2] if jumped else None}
