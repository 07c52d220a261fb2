"""Per-rank figures and one fleet view (issue 37, items 1-2): `StarvationMonitor(run_dir=DIR)` appends each rank's
interval figures to DIR/rank-R.jsonl; `dataflow profile --fleet DIR` names the rank that waits, its slow stage and
the job's verdict. Two ranks in one process (RANK set as a launcher sets it), on the KJV corpus of tests/data in
8 KB shards, each behind the same 30 ms step: rank 0 reads them from local disk, rank 1 from a slow storage
server (each shard answers after 0.3 s)."""

import json
import time


from dataflow import StarvationMonitor, StreamingDataLoader, StreamingDataset
from dataflow.cli import main
from dataflow.loading.stages import STAGES
from dataflow.profiling.fleet import format_fleet
from support.http_files import serve
from support.loading import kjv_data  # noqa: F401  (the fixture: KJV documents as byte tokens)
from support.loading import small_shards  # noqa: F401  (the fixture: uncompressed 8 KB KJV shards)
from support.http_files import _Slow


def _rank(data, run_dir, monkeypatch, rank, workers, step_s):
    monkeypatch.setenv("RANK", str(rank))
    monkeypatch.setenv("WORLD_SIZE", "2")
    loader = StreamingDataLoader(StreamingDataset(data, seq_len=64, rank=rank, world_size=2, shuffle_window=1),
                                 batch_size=16, num_workers=workers)
    mon = StarvationMonitor(run_dir=run_dir, log_every_s=0.05, warmup_steps=5)
    for n, batch in enumerate(mon.wrap(loader)):
        with mon.step():
            time.sleep(step_s)
        if n == 60:
            break
    mon.close()
    loader.close()


def test_the_fleet_view_names_the_rank_that_waits_and_its_stage(small_shards, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    _rank(small_shards, run, monkeypatch, 0, workers=0, step_s=0.03)
    with serve(small_shards, _Slow) as (url, _, _):
        _rank(url, run, monkeypatch, 1, workers=0, step_s=0.03)
    assert sorted(p.name for p in run.iterdir()) == ["rank-0.jsonl", "rank-1.jsonl"]
    assert main(["profile", "--fleet", str(run), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    r0, r1 = report["ranks"]
    assert (r0["rank"], r1["rank"]) == (0, 1) and r0["host"] == r1["host"]
    assert r0["steps"] == r1["steps"] == 61 and r0["steady"] and r1["steady"]
    print(format_fleet(report))
    assert r1["wait_share"] > 0.2 and r1["wait_share"] > 2 * r0["wait_share"]
    assert r1["slowest_stage"] == "fetch" and r0["slowest_stage"] in STAGES
    assert report["stragglers"] == [1] and report["slowest_rank"] == 1 and report["verdict"] == "input-bound"
    assert main(["profile", "--fleet", str(run)]) == 0
    text = capsys.readouterr().out
    assert f"STRAGGLER rank 1 on {r1['host']}: data wait" in text and f"slowest stage {r1['slowest_stage']}" in text
    trace, png = tmp_path / "fleet.json", tmp_path / "fleet.png"
    assert main(["profile", "--fleet", str(run), "--trace", str(trace), "--plot", str(png)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M"}
    assert names == {1: f"rank 0 on {r0['host']}", 2: f"rank 1 on {r1['host']}"}  # a track per rank
    assert {e["pid"] for e in events if e["ph"] == "X"} == {1, 2}
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_without_run_dir_nothing_is_written_and_a_folder_without_ranks_is_one_line(tmp_path, capsys):
    mon = StarvationMonitor()
    for _ in mon.wrap(range(3)):
        with mon.step():
            pass
    assert mon.fleet is None and list(tmp_path.iterdir()) == []
    assert main(["profile", "--fleet", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "holds no rank-R.jsonl" in err and len(err.strip().splitlines()) == 1
    assert main(["profile", "data"]) == 2 and "--fleet RUN_DIR" in capsys.readouterr().err
