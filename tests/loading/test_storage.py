"""Storage: local paths in place; remote shards through a shared, size-limited, multi-process cache.

Every remote test talks to a real server on 127.0.0.1: an http.server thread that counts GETs and can
inject 503s or damaged bytes, and moto's standalone S3 server in a subprocess.
"""

import hashlib
import http.server
import multiprocessing
import os
import pickle
import shutil
import socket
import threading
import time
from collections import Counter

import numpy as np
import pytest

from dataflow import FormatError, ShardWriter, TokenizerMeta
from dataflow.formats.manifest import ShardInfo, read_manifest
from dataflow.formats import remote
from dataflow.loading import storage as storage_mod
from dataflow.loading.storage import Storage, StorageError
from support.s3_server import moto_s3

BYTES = TokenizerMeta(kind="bytes", name="bytes", vocab_size=257, eos_id=256)
SEQ = 32


def _torch_loader():
    """StreamingDataset and StreamingDataLoader, imported late: spawned workers load this module and
    must not pay for torch."""
    from dataflow import StreamingDataLoader, StreamingDataset

    return StreamingDataset, StreamingDataLoader


# --- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def dataset(tmp_path_factory):
    """About a dozen small zstd Arrow shards of byte tokens."""
    out = tmp_path_factory.mktemp("ds")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "shard", "cache", "token", "stream", "lock", "evict"]
    with ShardWriter(str(out), tokenizer_meta=BYTES, shard_size="8KB", compression="zstd") as w:
        for i in range(120):
            text = " ".join(rng.choice(words, size=int(rng.integers(20, 120))))
            w.write(np.frombuffer(text.encode(), np.uint8).astype(np.uint16), id=f"doc{i}")
    return str(out)


@pytest.fixture(scope="module")
def shards(dataset):
    s = read_manifest(dataset).shards
    assert len(s) >= 8
    return s


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802
        srv = self.server
        with srv.mu:
            srv.gets[self.path] += 1
            failing = srv.fail.get(self.path, 0)
            if failing:
                srv.fail[self.path] = failing - 1
            cut = srv.cut.get(self.path, 0)
            if cut:
                srv.cut[self.path] = cut - 1
        time.sleep(srv.delay)
        if self.path in srv.gates:
            srv.gates[self.path].wait(timeout=120)
        if failing:
            self.send_error(srv.fail_status)
            return
        rel = self.path.lstrip("/")
        if not rel.startswith("ds/") or not os.path.isfile(os.path.join(srv.root, rel[3:])):
            self.send_error(404)
            return
        with open(os.path.join(srv.root, rel[3:]), "rb") as f:
            body = f.read()
        if self.path in srv.corrupt:
            body = bytes([body[0] ^ 0xFF]) + body[1:]
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if cut:  # the connection drops mid-body
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def http_server(dataset):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    srv.daemon_threads = True
    srv.root, srv.mu = dataset, threading.Lock()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def server(http_server, monkeypatch):
    """The HTTP server with fresh counters and faults; retries back off briefly in tests."""
    http_server.gets, http_server.fail, http_server.corrupt, http_server.gates = Counter(), {}, set(), {}
    http_server.cut = {}
    http_server.delay, http_server.fail_status = 0.0, 503
    http_server.url = f"http://127.0.0.1:{http_server.server_address[1]}/ds"
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    return http_server


def shard_gets(server, shards):
    return [server.gets[f"/ds/{s.path}"] for s in shards]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def cache_bytes(cache_dir):
    """Bytes of shard data in the cache (entries and partial downloads; lock files are empty, and the
    few bytes of a verified entry's `.ok` stamp are not shard data)."""
    total = 0
    for folder, _, names in os.walk(cache_dir):
        for name in names:
            if name.endswith(".ok"):
                continue
            try:
                total += os.path.getsize(os.path.join(folder, name))
            except FileNotFoundError:  # a download renamed or removed meanwhile
                pass
    return total


def windows(samples):
    return [tuple(s["input_ids"].tolist()) for s in samples]


# --- local ------------------------------------------------------------------------------------------
def test_local_and_file_urls_are_read_in_place(dataset, shards, tmp_path):
    for root in (dataset, "file://" + dataset):
        st = Storage(root, str(tmp_path / "cache"), cache_limit="10GB")
        assert st.local_path(shards[0]) == os.path.join(dataset, shards[0].path)
        st.fetch_ahead(shards)
        st.release(shards[0])
        st.close()
        assert st.downloads == 0 and st.cache_limit == 10 << 30
    assert not (tmp_path / "cache").exists()


# --- HTTP: downloads, retries, errors ---------------------------------------------------------------
def test_http_one_get_per_shard_and_transient_errors_are_retried(server, shards, tmp_path):
    server.fail[f"/ds/{shards[1].path}"] = 2  # 503 twice
    server.cut[f"/ds/{shards[3].path}"] = 1  # connection reset mid-body once
    with Storage(server.url, str(tmp_path)) as st:
        for s in shards:
            path = st.local_path(s)
            assert sha256(path) == s.sha256 and path.startswith(str(tmp_path))
            st.release(s)
        assert st.downloads == len(shards)
    assert shard_gets(server, shards) == [{1: 3, 3: 2}.get(i, 1) for i in range(len(shards))]
    with Storage(server.url, str(tmp_path)) as again:  # another process's view of the same cache
        assert all(sha256(again.local_path(s)) == s.sha256 for s in shards)
        assert again.downloads == 0
    assert sum(shard_gets(server, shards)) == len(shards) + 3
    leftovers = [n for _, _, names in os.walk(tmp_path) for n in names if ".part-" in n]
    assert leftovers == []


def test_missing_shard_is_an_immediate_clear_error(server, tmp_path):
    missing = ShardInfo(path="shard-99999.arrow", documents=1, tokens=1, bytes=10, sha256="0" * 64)
    with Storage(server.url, str(tmp_path)) as st, pytest.raises(FormatError) as e:
        st.local_path(missing)
    assert f"{server.url}/shard-99999.arrow" in str(e.value) and "not there" in str(e.value)
    assert server.gets["/ds/shard-99999.arrow"] == 1


def test_persistent_5xx_and_4xx_errors_name_the_url(server, shards, tmp_path):
    url = f"/ds/{shards[0].path}"
    server.fail[url] = 100
    with Storage(server.url, str(tmp_path), retries=3) as st, pytest.raises(StorageError) as e:
        st.local_path(shards[0])
    assert server.url + "/" + shards[0].path in str(e.value) and "503" in str(e.value)
    assert "after 3 attempts" in str(e.value) and server.gets[url] == 3
    server.gets.clear()
    server.fail_status = 403  # refused: not retried
    with Storage(server.url, str(tmp_path)) as st, pytest.raises(StorageError, match="403"):
        st.local_path(shards[0])
    assert server.gets[url] == 1


def test_corrupt_download_is_retried_then_refused(server, shards, tmp_path):
    url = f"/ds/{shards[2].path}"
    server.corrupt.add(url)
    with Storage(server.url, str(tmp_path)) as st:
        with pytest.raises(FormatError, match="do not match the manifest") as e:
            st.local_path(shards[2])
        assert server.url + "/" + shards[2].path in str(e.value) and "dataflow verify" in str(e.value)
        assert server.gets[url] == storage_mod.RETRIES and st.downloads == 0
        assert cache_bytes(str(tmp_path)) == 0  # nothing partial or wrong was kept
        server.corrupt.clear()  # the server is repaired: the same Storage recovers
        assert sha256(st.local_path(shards[2])) == shards[2].sha256


# --- download-ahead ---------------------------------------------------------------------------------
def test_prefetch_downloads_ahead_once(server, shards, tmp_path):
    server.delay = 0.01
    with Storage(server.url, str(tmp_path)) as st:
        st.fetch_ahead(shards)
        st.fetch_ahead(shards)  # queued or cached: nothing twice
        for s in reversed(shards):
            assert sha256(st.local_path(s)) == s.sha256
            st.release(s)
        assert st.downloads == len(shards)
    assert shard_gets(server, shards) == [1] * len(shards)


def test_prefetch_stays_within_the_cache_limit(server, shards, tmp_path):
    """With shards[0] in use and room for three, the fetch-ahead brings shards[1:3] and stops there: what it
    fetched is held until read (it never evicts work done ahead to fetch a later shard: before, it did, 1 run
    in 5, and fetched it again), nothing is fetched twice, and the limit holds. Once the reader is done with
    shard 1, the queue goes on with shard 3 in its room."""
    limit = sum(s.bytes for s in shards[:3])
    with Storage(server.url, str(tmp_path), cache_limit=limit) as st:
        held = st.local_path(shards[0])
        st.fetch_ahead(shards)
        while st.downloads < 3 or st._ahead._active:  # shards 1 and 2 in, the queue waiting for room
            time.sleep(0.01)
        assert shard_gets(server, shards) == [1, 1, 1] + [0] * (len(shards) - 3)
        assert cache_bytes(str(tmp_path)) <= limit
        st.local_path(shards[1])
        st.release(shards[1])  # read: its room goes to shard 3
        while st.downloads < 4 or st._ahead._active:
            time.sleep(0.01)
        assert shard_gets(server, shards)[:5] == [1, 1, 1, 1, 0]
        assert os.path.exists(held) and cache_bytes(str(tmp_path)) <= limit


# --- eviction ---------------------------------------------------------------------------------------
def test_eviction_is_least_recently_used(server, shards, tmp_path):
    s0, s1, s2, s3 = shards[:4]
    limit = s0.bytes + s2.bytes + max(s1.bytes, s3.bytes)  # room for three: s3 needs one evicted
    with Storage(server.url, str(tmp_path), cache_limit=limit) as st:
        paths = {}
        for s in (s0, s1, s2, s0, s3):  # s0 is read again, so s1 is the least recently used
            paths[s.path] = st.local_path(s)
            st.release(s)
        assert [os.path.exists(paths[s.path]) for s in (s0, s1, s2, s3)] == [True, False, True, True]
        assert cache_bytes(str(tmp_path)) <= st.cache_limit and st.downloads == 4


def test_eviction_never_deletes_a_shard_in_use(server, shards, tmp_path):
    reader = Storage(server.url, str(tmp_path))
    pinned = reader.local_path(shards[0])  # held by another "process" of this machine
    small = max(s.bytes for s in shards)
    with Storage(server.url, str(tmp_path), cache_limit=2 * small) as st:
        held: list[ShardInfo] = []
        for s in shards[1:]:
            assert sha256(st.local_path(s)) == s.sha256
            held.append(s)
            if len(held) > 2:  # read two at a time, like a loader between blocks
                st.release(held.pop(0))
            in_use = shards[0].bytes + sum(h.bytes for h in held)
            assert cache_bytes(str(tmp_path)) <= st.cache_limit + in_use
        assert sha256(pinned) == shards[0].sha256
        reader.release(shards[0])
        for h in held:
            st.release(h)
        st.local_path(shards[1])  # evicts what is no longer in use, the pinned shard included
        assert cache_bytes(str(tmp_path)) <= st.cache_limit + shards[1].bytes
        assert not os.path.exists(pinned)
    reader.close()


# --- several processes, one cache -------------------------------------------------------------------
def _share_cache_worker(url, cache_dir, limit, seed, barrier, results):
    """Reads every shard in its own order, two at a time, checking each file on open and on release."""
    shards = read_manifest(url).shards
    order = np.random.default_rng(seed).permutation(len(shards))
    st = Storage(url, cache_dir, cache_limit=limit)
    barrier.wait()
    st.fetch_ahead([shards[i] for i in order[:4]])
    bad, held = [], []
    for i in order:
        held.append((shards[i], st.local_path(shards[i])))
        for s, path in held[-1:] + (held[:1] if len(held) > 2 else []):
            if not os.path.exists(path) or sha256(path) != s.sha256:
                bad.append(s.path)
        if len(held) > 2:
            st.release(held.pop(0)[0])
    st.close()
    results.put((st.downloads, bad))


def _run_sharing(url, cache_dir, limit, n=3):
    ctx = multiprocessing.get_context("spawn")
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=_share_cache_worker, args=(url, cache_dir, limit, seed, barrier, results))
             for seed in range(n)]
    for p in procs:
        p.start()
    got = [results.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    return [d for d, _ in got], [bad for _, bad in got]


def test_processes_share_the_cache_with_one_download_per_shard(server, shards, tmp_path):
    server.delay = 0.005
    downloads, bad = _run_sharing(server.url, str(tmp_path), None)
    assert bad == [[]] * len(bad)  # every file complete and right whenever a process looked
    assert sum(downloads) == len(shards)
    assert shard_gets(server, shards) == [1] * len(shards)


def test_processes_evicting_never_delete_each_others_shards(server, shards, tmp_path):
    limit = 3 * max(s.bytes for s in shards)  # far less than three processes hold: constant eviction
    downloads, bad = _run_sharing(server.url, str(tmp_path), limit)
    assert bad == [[]] * len(bad)
    assert sum(downloads) == sum(shard_gets(server, shards)) >= len(shards)
    assert cache_bytes(str(tmp_path)) <= limit + 3 * 2 * max(s.bytes for s in shards)


def test_storage_pickles_without_its_locks_and_threads(server, shards, tmp_path):
    st = Storage(server.url, str(tmp_path), cache_limit="1MB")
    st.local_path(shards[0])
    copy = pickle.loads(pickle.dumps(st))
    assert copy.downloads == 0 and copy.cache_limit == 1 << 20
    assert sha256(copy.local_path(shards[1])) == shards[1].sha256
    copy.close()
    st.close()


def _read_in_child(st, shard, results):
    results.put(sha256(st.local_path(shard)) == shard.sha256)


def test_forked_child_does_not_inherit_the_parents_download_lock(server, shards, tmp_path):
    """A DataLoader worker forked while the parent downloads ahead: the parent's `.dl` lock must not
    stay held by the child's inherited fd (the child would then wait on itself forever)."""
    gate = server.gates[f"/ds/{shards[0].path}"] = threading.Event()
    st = Storage(server.url, str(tmp_path))
    st.fetch_ahead([shards[0]])
    while server.gets[f"/ds/{shards[0].path}"] == 0:  # the parent's thread now holds `.dl`, mid-download
        time.sleep(0.01)
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    child = ctx.Process(target=_read_in_child, args=(st, shards[0], results))
    child.start()
    gate.set()
    assert results.get(timeout=120) is True
    child.join(timeout=60)
    st.close()
    assert child.exitcode == 0 and st.downloads == 1
    assert server.gets[f"/ds/{shards[0].path}"] == 1


def test_abandoned_partial_downloads_are_cleared(server, shards, tmp_path):
    with Storage(server.url, str(tmp_path), cache_limit=2 * shards[0].bytes) as st:
        entry = st._entry(shards[1])
        os.makedirs(os.path.dirname(entry))
        part = f"{entry}.part-999999-1-{shards[1].bytes}"
        with open(part, "wb") as f:  # a downloader killed mid-way
            f.write(b"x" * 3 * shards[0].bytes)
        st.local_path(shards[0])  # making room deletes it: no live process holds its `.dl`
        assert not os.path.exists(part)
        assert cache_bytes(str(tmp_path)) == shards[0].bytes


# --- end to end -------------------------------------------------------------------------------------
def test_http_dataset_iterates_like_the_local_one(server, dataset, shards, tmp_path):
    StreamingDataset, StreamingDataLoader = _torch_loader()
    local = windows(StreamingDataset(dataset, seq_len=SEQ, seed=5, shuffle_window=3))
    remote = windows(StreamingDataset(server.url, seq_len=SEQ, seed=5, shuffle_window=3, cache_dir=str(tmp_path)))
    assert remote == local and len(local) > 100
    assert shard_gets(server, shards) == [1] * len(shards)

    def loader_windows(source, **kw):  # worker processes (forked) share the cache
        ds = StreamingDataset(source, seq_len=SEQ, seed=5, shuffle_window=3, **kw)
        return [tuple(row.tolist()) for b in StreamingDataLoader(ds, batch_size=8, num_workers=2)
                for row in b["input_ids"]]

    assert loader_windows(server.url, cache_dir=str(tmp_path / "w")) == loader_windows(dataset)
    assert shard_gets(server, shards) == [2] * len(shards)


# --- S3 (moto) --------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3(dataset):
    """moto's S3 server on 127.0.0.1 holding the dataset at s3://dataflow-test/ds."""
    with moto_s3("dataflow-test") as (endpoint, client):
        for name in os.listdir(dataset):
            client.upload_file(os.path.join(dataset, name), "dataflow-test", f"ds/{name}")
        yield endpoint


def test_s3_shards_through_the_cache(s3, dataset, shards, tmp_path, monkeypatch):
    StreamingDataset, _ = _torch_loader()
    opts = {"client_kwargs": {"endpoint_url": s3}}
    with Storage("s3://dataflow-test/ds", str(tmp_path), storage_options=opts) as st:
        for s in shards:
            assert sha256(st.local_path(s)) == s.sha256
            st.release(s)
        assert st.downloads == len(shards)
        missing = ShardInfo(path="nope.arrow", documents=1, tokens=1, bytes=1, sha256="0" * 64)
        with pytest.raises(FormatError, match="s3://dataflow-test/ds/nope.arrow"):
            st.local_path(missing)
    # the dataset end to end: botocore reads the endpoint from AWS_ENDPOINT_URL (manifest and shards)
    monkeypatch.setenv("AWS_ENDPOINT_URL", s3)
    remote = StreamingDataset("s3://dataflow-test/ds", seq_len=SEQ, seed=2, cache_dir=str(tmp_path / "e2e"))
    assert windows(remote) == windows(StreamingDataset(dataset, seq_len=SEQ, seed=2))
    shutil.rmtree(tmp_path / "e2e")


# --- the reliability issue: the manifest is retried, and a silent server cannot hang the loader ---------
def test_a_failing_manifest_request_is_retried(server):
    server.fail["/ds/index.json"] = 2  # two 503s, then the manifest
    m = read_manifest(server.url)
    assert len(m.shards) >= 8 and server.gets["/ds/index.json"] >= 3  # two refused, then served


def test_a_manifest_that_keeps_failing_is_a_server_error_not_a_missing_dataset(server):
    server.fail["/ds/index.json"] = 100
    with pytest.raises(StorageError) as e:
        read_manifest(server.url)
    assert "no manifest" not in str(e.value) and "\n" not in str(e.value)
    assert server.gets["/ds/index.json"] == remote.RETRIES


def test_a_server_that_never_answers_is_an_error_not_a_hang(tmp_path, monkeypatch):
    """It accepts connections (the kernel does, from its backlog) and never sends a byte."""
    from dataflow import DataflowError

    monkeypatch.setenv("DATAFLOW_READ_TIMEOUT_S", "0.5")
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)
    try:
        t0 = time.monotonic()
        with pytest.raises(DataflowError):
            read_manifest(f"http://127.0.0.1:{silent.getsockname()[1]}/ds")
        assert time.monotonic() - t0 < 60
    finally:
        silent.close()


def test_a_file_planted_in_the_cache_is_checked_not_served(server, shards, tmp_path):
    """A cached file of the right size that no download verified (the reliability issue's H3) is hashed
    before use; a wrong one is replaced by a fresh download."""
    cache_dir = str(tmp_path / "cache")
    st = Storage(server.url, cache_dir)
    entry = st._entry(shards[0])
    os.makedirs(os.path.dirname(entry), exist_ok=True)
    with open(entry, "wb") as f:
        f.write(b"\0" * shards[0].bytes)
    path = st.local_path(shards[0])
    assert hashlib.sha256(open(path, "rb").read()).hexdigest() == shards[0].sha256
    assert st.downloads == 1
    st.release(shards[0])
    st.close()
    again = Storage(server.url, cache_dir)  # the verified copy is reused without downloading or hashing
    again.local_path(shards[0])
    assert again.downloads == 0 and server.gets[f"/ds/{shards[0].path}"] == 1
    again.close()
