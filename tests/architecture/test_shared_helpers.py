"""One helper each: lock files (`dataflow.locks`), hashing a file (`formats.hashing`), a bounded producer
thread (`dataflow.threads`); and no second copy of them in the packages that use them."""

import fcntl
import hashlib
import multiprocessing
import os
import pathlib
import re
import threading

import pytest

from dataflow import locks
from dataflow.formats.hashing import sha256_file, sha256_local
from dataflow.threads import Producer, produced_ahead

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _hold(path, ready, done):
    fd = locks.lock(path, fcntl.LOCK_EX)
    ready.set()
    done.wait(30)
    locks.unlock(fd)


@pytest.fixture
def held_by_another_process(tmp_path):
    path = str(tmp_path / "sub" / "x.lock")
    ctx = multiprocessing.get_context("fork")
    ready, done = ctx.Event(), ctx.Event()
    p = ctx.Process(target=_hold, args=(path, ready, done))
    p.start()
    assert ready.wait(30)
    yield path
    done.set()
    p.join(30)


def test_a_lock_held_elsewhere_is_seen_and_not_taken(held_by_another_process):
    path = held_by_another_process
    assert locks.held_elsewhere(path)
    assert locks.lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB) is None
    assert locks.lock(path, fcntl.LOCK_SH | fcntl.LOCK_NB) is None
    fd = os.open(path, os.O_RDONLY)
    os.close(fd)  # the lock file is there while held


def test_release_tidies_the_lock_file_only_when_nobody_holds_it(tmp_path):
    path = str(tmp_path / "a" / "b.lock")
    assert not locks.held_elsewhere(path)  # no file yet
    first = locks.lock(path, fcntl.LOCK_SH)
    second = locks.lock(path, fcntl.LOCK_SH)  # shared: both hold it
    locks.release(first, path)
    assert os.path.exists(path)  # the second still holds it
    locks.release(second, path)
    assert not os.path.exists(path)
    assert locks.lock(path, fcntl.LOCK_EX | fcntl.LOCK_NB) is not None  # made again on demand


def test_a_lock_file_that_cannot_be_made_raises_what_the_caller_says(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")

    class Unusable(Exception):
        pass

    with pytest.raises(Unusable):
        locks.lock(str(blocker / "x.lock"), fcntl.LOCK_EX, unusable=lambda e: Unusable(str(e)))
    with pytest.raises(OSError):
        locks.lock(str(blocker / "x.lock"), fcntl.LOCK_EX)


@pytest.mark.parametrize("size", [0, 1, (1 << 20) - 1, 1 << 20, (1 << 20) + 1, 3 * (1 << 20) + 12345])
@pytest.mark.parametrize("sync", [False, True])
def test_sha256_local_is_the_files_digest_and_size(tmp_path, size, sync):
    data = os.urandom(size)
    path = tmp_path / "f"
    path.write_bytes(data)
    assert sha256_local(str(path), sync=sync) == (size, hashlib.sha256(data).hexdigest())
    assert sha256_file(str(path)) == hashlib.sha256(data).hexdigest()


def test_the_loaders_hashes_are_the_one_helper(tmp_path):
    from dataflow.loading import cache

    path = tmp_path / "f"
    path.write_bytes(b"abc" * 100_000)
    assert cache.sha256_and_sync(str(path)) == sha256_local(str(path))


def test_produced_ahead_keeps_order_and_raises_the_producers_error():
    assert list(produced_ahead(range(50), depth=3, name="t")) == list(range(50))

    def failing():
        yield 1
        raise ValueError("damaged input")

    it = produced_ahead(failing(), depth=2, name="t")
    assert next(it) == 1
    with pytest.raises(ValueError, match="damaged input"):
        next(it)


@pytest.mark.parametrize("taken", [0, 1, 5])
def test_stopping_early_loses_nothing(taken):
    produced, dropped = [], []

    def items():
        for i in range(1000):
            produced.append(i)
            yield i

    it = produced_ahead(items(), depth=4, name="t", drop=dropped.append)
    got = [next(it) for _ in range(taken)] if taken else []
    it.close()
    assert got + dropped == produced  # every item produced was taken or dropped, in order
    assert threading.active_count() >= 1 and all(t.name != "t" for t in threading.enumerate())


def test_a_producer_stopped_hands_back_what_was_never_taken_in_order():
    gate = threading.Event()

    def work(p):
        for i in range(10):
            if not p.put(i):
                break
        gate.set()

    p = Producer(depth=3, name="t")
    p.start(work)
    assert p.get() == 0
    left = p.stop(join_s=30)
    assert left == list(range(1, 1 + len(left))) and 3 <= len(left) <= 4  # the queue, then the item in hand


def _python_files(folder):
    return sorted((ROOT / folder).rglob("*.py"))


def test_no_second_copy_of_the_helpers():
    """flock only in dataflow/locks.py; no producer thread's queue in the loader or the profiler (the
    helper is dataflow/threads.py); preprocess/ adopts both later. (DATAFLOW_* only in env.py: test_env.py.)"""
    adopted = [p for p in _python_files("dataflow") if "preprocess" not in p.parts]
    bad = [f"{p.relative_to(ROOT)}: flock" for p in adopted
           if p.name != "locks.py" and "fcntl.flock(" in p.read_text()]
    readers = _python_files("dataflow/loading") + _python_files("dataflow/profiling")  # (arrow.py's is a writer)
    bad += [f"{p.relative_to(ROOT)}: a producer thread's queue" for p in readers
            if re.search(r"queue\.Queue\(maxsize", p.read_text())]
    assert not bad, "\n".join(bad)
