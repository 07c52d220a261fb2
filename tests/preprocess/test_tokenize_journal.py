"""Workers write finished shards; the journal lists those the coordinator put in place: a crash at any point
(before, during or after a worker's shard write, between putting shards in place and the journal save,
between two manifests) resumes to the bytes of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess

import numpy as np
import pytest

from dataflow import ShardWriter, TokenizerMeta
from dataflow.formats.writer import DocIds
from support import kill_points
from support.cli import DATAFLOW, dataset_bytes

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)


POINTS = [(1, {"shard": "before", "unit": 9}), (2, {"shard": "during", "unit": 14}),
          (1, {"shard": "after", "unit": 20}), (2, {"renamed": 26}), (1, {"next_unit": 33}),
          (2, {"shard": "during", "unit": 40})]


def test_kill_9_around_a_workers_shard_write_resumes_to_the_same_bytes(kjv10, tmp_path):
    """Each run resumes the one before and is killed where the test chooses (support/kill_points.py), with 1 worker
    (in this process) and 2 (in a worker process: the run dies with it)."""
    args = ["tokenize", str(kjv10), "--no-progress", "--shard-size", "600KB", "--unit-size", "1MB"]
    subprocess.run([*DATAFLOW, *args, "-o", str(tmp_path / "ref"), "--workers", "2"], check=True,
                   capture_output=True)
    out = tmp_path / "killed"
    journal = out / "_work" / "task-00000" / "journal.json"
    committed = -1
    for workers, when in POINTS:
        p = subprocess.run(kill_points.command(when, *args, "-o", out, "--workers", workers), capture_output=True)
        assert p.returncode == -signal.SIGKILL, (when, p.stderr.decode())  # it got there, and died there
        progress = json.loads(journal.read_text())
        assert progress["next_unit"] > committed, when  # every run got further
        committed = progress["next_unit"]
        listed = {s["path"] for s in progress["shards"]["train"]}
        if "renamed" in when:  # shards in place that no journal lists yet: the rerun drops and redoes them
            assert set(n for n in os.listdir(out) if n.startswith("shard-")) - listed
    subprocess.run([*DATAFLOW, *args, "-o", str(out), "--workers", "1"], check=True, capture_output=True)
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")
    assert not (out / "_work").exists()
    assert [n for n in os.listdir(out) if n.startswith(".")] == []


@pytest.mark.heavy
def test_soak_many_kills_resume_to_the_same_bytes(kjv10, tmp_path):
    """Twelve kills in one run's life, at chosen journal states and at random moments, whatever they hit."""
    args = ["tokenize", str(kjv10), "--no-progress", "--shard-size", "10MB", "--unit-size", "1MB"]
    subprocess.run([*DATAFLOW, *args, "-o", str(tmp_path / "ref"), "--workers", "2"], check=True,
                   capture_output=True)
    out = tmp_path / "killed"
    rng = np.random.default_rng(7)
    states = [{"shard": "before", "unit": 0}, {"shard": "during", "unit": 0}, {"shard": "after", "unit": 0},
              {"renamed": 0}]
    for round_ in range(12):
        workers = str(1 + round_ % 2)
        if round_ % 3 == 2:  # a random moment: no claim about what it hits
            proc = subprocess.Popen([*DATAFLOW, *args, "-o", str(out), "--workers", workers],
                                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                proc.wait(timeout=float(rng.uniform(0.5, 3.0)))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        else:
            when = dict(states[int(rng.integers(len(states)))])
            key = "renamed" if "renamed" in when else "unit"
            when[key] = int(rng.integers(0, 44))
            p = subprocess.run(kill_points.command(when, *args, "-o", out, "--workers", workers), capture_output=True)
            assert p.returncode in (0, -signal.SIGKILL), p.stderr.decode()
        if not (out / "_work").exists() and (out / "index.json").exists():
            break  # finished before this kill point came
    subprocess.run([*DATAFLOW, *args, "-o", str(out), "--workers", "1"], check=True, capture_output=True)
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")


def test_a_consumer_that_stops_early_stops_the_reading_thread_at_once():
    """The read-ahead and feeder threads: a commit that fails (say, too many bad records) leaves at once, and
    what was read ahead but never taken is dropped (the feeder cancels those units)."""
    import threading

    from dataflow.threads import produced_ahead as _threaded

    dropped = []
    items = _threaded(iter(range(100)), 3, "test-reader", drop=dropped.append)
    assert [next(items), next(items)] == [0, 1]
    items.close()  # joins the thread: it must have stopped (not be left blocked on its full queue)
    assert not any(t.name == "test-reader" for t in threading.enumerate())
    assert dropped and all(d >= 2 for d in dropped)

    def damaged():
        yield 1
        raise EOFError("damaged")

    with pytest.raises(EOFError):
        list(_threaded(damaged(), 1, "test-reader"))


def test_interrupted_runs_resume_to_the_same_bytes_and_leave_no_temp_file(kjv10, tmp_path):
    """Ctrl-C while a worker's shard is half written: exit 130 without a traceback, nothing half written in the
    dataset; the rerun resumes to the bytes of an uninterrupted run."""
    args = ["tokenize", str(kjv10), "--no-progress", "--shard-size", "100MB", "--unit-size", "1MB",
            "--workers", "1"]
    subprocess.run([*DATAFLOW, *args, "-o", str(tmp_path / "ref")], check=True, capture_output=True)
    out = tmp_path / "out"
    p = subprocess.run(kill_points.command({"shard": "during", "unit": 12, "signal": "INT"}, *args, "-o", out),
                       capture_output=True, text=True)
    assert p.returncode == 130 and "Traceback" not in p.stderr, p.stderr
    assert [n for n in os.listdir(out) if n.endswith(".tmp")] == []
    env = dict(os.environ, DATAFLOW_JOURNAL_SECONDS="100")
    subprocess.run([*DATAFLOW, *args, "-o", str(out)], check=True, capture_output=True, env=env)
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")
    assert [n for n in os.listdir(out) if n.startswith(".") or n == "_work"] == []


@pytest.mark.timing  # the 2 s bound on the stop is wall-clock, on a shared machine
@pytest.mark.parametrize("workers", ["1", "2"])
def test_ctrl_c_stops_at_once_and_the_rerun_resumes(kjv10, tmp_path, workers):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while a worker is in the middle of a
    bundle: `interrupted` and exit 130 within 2 s, not after the bundles in flight; the rerun completes."""
    args = ["tokenize", str(kjv10), "--no-progress", "--unit-size", "4MB", "--workers", workers]
    out = tmp_path / "out"
    # a worker holds bundle 8 (as a long one would); others may be done
    code, err, took = kill_points.ctrl_c_while_holding(8, tmp_path / "holding", *args, "-o", out)
    assert code == 130 and err.strip() == "dataflow tokenize: interrupted", err
    assert took < 2, took
    subprocess.run([*DATAFLOW, *args, "-o", str(out)], check=True, capture_output=True)
    subprocess.run([*DATAFLOW, *args, "-o", str(tmp_path / "ref")], check=True, capture_output=True)
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_kill_between_the_manifests_of_two_splits_resumes(kjv, tmp_path, workers):
    """train/index.json written, val's not yet, the journal still there: the rerun does not take the run for
    finished; it completes to the same bytes."""
    args = ["tokenize", str(kjv), "--no-progress", "--val-fraction", "0.1", "--workers", workers,
            "--unit-size", "256KB"]
    subprocess.run([*DATAFLOW, *args, "-o", str(tmp_path / "ref")], check=True, capture_output=True)
    out = tmp_path / "out"
    p = subprocess.run(kill_points.command({"manifest": True}, *args, "-o", out), capture_output=True)
    assert p.returncode == -signal.SIGKILL and (out / "train" / "index.json").exists()
    assert not (out / "val" / "index.json").exists()
    subprocess.run([*DATAFLOW, *args, "-o", str(out)], check=True, capture_output=True)
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")


def test_write_batch_never_keeps_the_callers_array(tmp_path):
    """A caller may refill its array as soon as write_batch returns, even while the shard is being written."""
    from dataflow.formats.arrow import RECORD_BATCH_TOKENS, ArrowShard

    buf = np.empty(RECORD_BATCH_TOKENS, dtype=np.uint16)  # each document fills a record batch by itself
    with ShardWriter(str(tmp_path), tokenizer_meta=BYTES, shard_size="1GB") as w:
        for k in range(6):
            buf[:] = k
            w.write_batch(buf, np.array([0, len(buf)]), DocIds.from_list([f"doc{k}"]))
    for doc_id, tokens in ArrowShard(str(tmp_path / "shard-00000.arrow")).documents():
        assert np.unique(tokens).tolist() == [int(doc_id[3:])]


def test_a_shard_size_past_the_limit_is_one_line(kjv, tmp_path):
    p = subprocess.run([*DATAFLOW, "tokenize", str(kjv), "-o", str(tmp_path / "o"), "--shard-size", "1TB",
                        "--no-progress"], capture_output=True, text=True)
    assert p.returncode == 2 and p.stderr.count("\n") == 1 and "8GB" in p.stderr
