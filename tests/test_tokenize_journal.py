"""The journal keeps an open shard's written record batches in its temp file, and only the documents still in
memory in a spill: a crash at any point resumes to the bytes of an uninterrupted run."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
import zstandard

import dataflow.formats.arrow as arrow
from dataflow import ShardWriter, TokenizerMeta
from dataflow.formats.writer import DocIds
from dataflow.preprocess.journal import SpilledWriter
import tokenize_kill_points as kill_points
from test_tokenize_scale import DATAFLOW, dataset_bytes

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)


def _docs(n, seed=0):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 257, size=rng.integers(1, 300)).astype(np.uint16) for _ in range(n)]


def _write(sw, docs, ids):
    offsets = np.concatenate([[0], np.cumsum([len(d) for d in docs])])
    sw.write_batch(np.concatenate(docs), offsets, DocIds.from_list(ids))


def _shards(folder):
    return {n: (folder / n).read_bytes() for n in sorted(os.listdir(folder)) if n.startswith("shard-")}


@pytest.mark.parametrize("fmt", ["arrow", "tar"])
@pytest.mark.parametrize("finish_before_crash", [False, True])
def test_restore_from_the_journal_gives_the_bytes_of_an_uninterrupted_run(tmp_path, monkeypatch, fmt,
                                                                         finish_before_crash):
    """Save the journal state mid-shard (record batches written, more documents in memory), write on (also past
    the end of that shard: its temp file is renamed before the crash), crash, restore, write the rest."""
    monkeypatch.setattr(arrow, "RECORD_BATCH_TOKENS", 3000)
    docs, ids = _docs(900), [f"d{i}" for i in range(900)]
    with ShardWriter(str(tmp_path / "ref"), tokenizer_meta=BYTES, format=fmt, shard_size="60KB") as w:
        _write(w, docs, ids)
    (tmp_path / "run").mkdir()
    (tmp_path / "work").mkdir()
    w = ShardWriter(str(tmp_path / "run"), tokenizer_meta=BYTES, format=fmt, shard_size="60KB")
    sw = SpilledWriter(w, str(tmp_path / "work"), "train")
    k = 0
    while not (fmt == "tar" and k == 200 or w._file is not None and len(w._file.layout) >= 2 and w.pending_count):
        _write(sw, docs[k:k + 1], ids[k:k + 1])  # one at a time: up to both kinds of state in the open shard
        k += 1
    state = json.loads(json.dumps(sw.state()))  # as the journal stores it
    shards_then, more = len(w.shards), k
    while more < len(docs) and (len(w.shards) == shards_then if finish_before_crash else more < k + 5):
        _write(sw, docs[more:more + 1], ids[more:more + 1])  # on: to the end of that shard (renamed) or not
        more += 1
    assert (len(w.shards) > shards_then) == finish_before_crash
    # crash: nothing is closed; a new process restores and writes what the journal did not cover
    w2 = ShardWriter(str(tmp_path / "run"), tokenizer_meta=BYTES, format=fmt, shard_size="60KB")
    sw2 = SpilledWriter(w2, str(tmp_path / "work"), "train")
    sw2.restore(state)
    _write(sw2, docs[k:], ids[k:])
    sw2.state()
    sw2.forget_stale()
    w2.close()
    assert _shards(tmp_path / "run") == _shards(tmp_path / "ref")
    assert [n for n in os.listdir(tmp_path / "run") if n.endswith(".tmp")] == []


def test_the_spill_holds_only_what_no_file_holds(tmp_path, monkeypatch):
    """Arrow: tokens go to their shard once; the spill mirrors only the record batch still being filled."""
    monkeypatch.setattr(arrow, "RECORD_BATCH_TOKENS", 3000)
    docs, ids = _docs(2000, seed=1), [f"d{i}" for i in range(2000)]
    w = ShardWriter(str(tmp_path / "run"), tokenizer_meta=BYTES, shard_size="1MB")
    sw = SpilledWriter(w, str(tmp_path), "train")
    spilled = 0
    for start in range(0, 2000, 50):
        _write(sw, docs[start:start + 50], ids[start:start + 50])
        state = sw.state()
        spilled = max(spilled, state["spill_bytes"])
        sw.forget_stale()
    assert spilled < 3000 * 2 + 50 * 300 * 2 + 4096  # < one record batch (and a unit) of uint16 tokens
    assert len([n for n in os.listdir(tmp_path) if n.endswith(".spill")]) == 1
    w.close()


@pytest.fixture(scope="module")
def big_corpus(kjv, tmp_path_factory):
    """KJV ten times (44 MB of text): with the bytes tokenizer, several 2M-token record batches per shard."""
    with open(kjv, "rb") as f:
        lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines(keepends=True)
    path = tmp_path_factory.mktemp("big") / "kjv10.jsonl"
    with open(path, "wb") as f:
        for copy in range(10):
            for line in lines:
                f.write(line.replace(b'"id": "', f'"id": "{copy}-'.encode(), 1))
    return path


def test_kill_9_between_and_inside_record_batches_resumes_to_the_same_bytes(big_corpus, tmp_path):
    """Each run resumes the one before and is killed where the test chooses (tokenize_kill_points): with record
    batches of the open shard on disk, in the middle of writing one, and with a new shard only in the spill."""
    args = ["tokenize", str(big_corpus), "--no-progress", "--shard-size", "10MB", "--unit-size", "1MB"]
    subprocess.run([*DATAFLOW, *args, "-o", str(tmp_path / "ref"), "--workers", "2"], check=True,
                   capture_output=True)
    out = tmp_path / "killed"
    journal = out / "_work" / "task-00000" / "journal.json"
    for workers, when in [(1, {"open_file": True}), (2, {"torn_batch": True}), (1, {"fresh_shard": True})]:
        p = subprocess.run(kill_points.command(when, *args, "-o", out, "--workers", workers), capture_output=True)
        assert p.returncode == -signal.SIGKILL, (when, p.stderr.decode())  # it got there, and died there
        train = json.loads(journal.read_text())["splits"]["train"]
        if "fresh_shard" in when:
            assert train["shards"] and not train["file"] and train["spill_bytes"] > 0
        else:
            assert train["file"]["batches"] >= 1 and train["spill_bytes"] > 0
        if "torn_batch" in when:  # the temp file holds half a batch more than the journal names
            assert (out / train["file"]["temp"]).stat().st_size > train["file"]["bytes"]
    subprocess.run([*DATAFLOW, *args, "-o", str(out), "--workers", "1"], check=True, capture_output=True)
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")
    assert not (out / "_work").exists()
    assert [n for n in os.listdir(out) if n.startswith(".")] == []


@pytest.mark.heavy
def test_soak_many_kills_resume_to_the_same_bytes(big_corpus, tmp_path):
    """Twelve kills in one run's life, at chosen journal states and at random moments, whatever they hit."""
    args = ["tokenize", str(big_corpus), "--no-progress", "--shard-size", "10MB", "--unit-size", "1MB"]
    subprocess.run([*DATAFLOW, *args, "-o", str(tmp_path / "ref"), "--workers", "2"], check=True,
                   capture_output=True)
    out = tmp_path / "killed"
    rng = np.random.default_rng(7)
    states = [{"open_file": True}, {"torn_batch": True}, {"fresh_shard": True}]
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
            when = states[int(rng.integers(len(states)))]
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

    from dataflow.preprocess.executors import _threaded

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


def test_interrupted_runs_resume_to_the_same_bytes_and_leave_no_temp_file(big_corpus, tmp_path):
    """Ctrl-C (or any error) while a shard is half written keeps what the journal names; the rerun, which here
    finishes before its first save, resumes to the bytes of an uninterrupted run and removes the temp file."""
    args = ["tokenize", str(big_corpus), "--no-progress", "--shard-size", "100MB", "--unit-size", "1MB",
            "--workers", "1"]
    subprocess.run([*DATAFLOW, *args, "-o", str(tmp_path / "ref")], check=True, capture_output=True)
    out = tmp_path / "out"
    p = subprocess.run(kill_points.command({"open_file": True, "signal": "INT"}, *args, "-o", out),
                       capture_output=True, text=True)
    assert p.returncode == 130 and "Traceback" not in p.stderr, p.stderr
    assert [n for n in os.listdir(out) if n.endswith(".tmp")]  # kept for the rerun
    env = dict(os.environ, DATAFLOW_JOURNAL_SECONDS="100")
    subprocess.run([*DATAFLOW, *args, "-o", str(out)], check=True, capture_output=True, env=env)
    assert dataset_bytes(out) == dataset_bytes(tmp_path / "ref")
    assert [n for n in os.listdir(out) if n.startswith(".") or n == "_work"] == []


def test_a_kill_between_the_manifests_of_two_splits_resumes(kjv, tmp_path):
    """train/index.json written, val's not yet: the rerun does not take the run for finished; it completes."""
    args = ["tokenize", str(kjv), "--no-progress", "--val-fraction", "0.1", "--workers", "1"]
    subprocess.run([*DATAFLOW, *args, "-o", str(tmp_path / "ref")], check=True, capture_output=True)
    out = tmp_path / "out"
    inject = ("import os, signal, sys\n"
              "from dataflow.formats import writer\n"
              "close = writer.ShardWriter.close\n"
              "def killed(self):\n"
              "    if self.out.endswith('val'): os.kill(os.getpid(), signal.SIGKILL)\n"
              "    return close(self)\n"
              "writer.ShardWriter.close = killed\n"
              "from dataflow.cli import main\n"
              "sys.exit(main(sys.argv[1:]))")
    p = subprocess.run([sys.executable, "-c", inject, *args, "-o", str(out)], capture_output=True)
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
