"""Issue 37 under torchrun (gloo, two CPU processes), one of them given a slow data path (shards from a slow storage
server): the straggler line appears during the run on rank 0 (`StarvationMonitor.name_stragglers`, an all-gather
at log intervals), the fleet report names that rank and its slow stage, and the data-order audit of the same run,
stopped and resumed on the two ranks, reports every sample once."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from dataflow.audit.replay import audit_folder
from dataflow.profiling.fleet import fleet_report
from support.http_files import serve
from support.loading import kjv_data  # noqa: F401  (small_shards is made from it)
from support.http_files import _Slow
from support.loading import small_shards  # noqa: F401  (the fixture: uncompressed 8 KB KJV shards)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent("""
    import json, sys, time
    import torch.distributed as dist
    from dataflow import StarvationMonitor, StreamingDataLoader, StreamingDataset
    local, url, run, audit, phase = sys.argv[1:6]
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = StreamingDataset(url if rank == 1 else local, seq_len=64, shuffle_window=1)
    loader = StreamingDataLoader(ds, batch_size=16, audit=audit)
    if phase == "resume":
        with open(f"{audit}/state.json") as f:
            loader.load_state_dict(json.load(f))
    mon = StarvationMonitor(run_dir=run, log_every_s=0.1, warmup_steps=5)
    lines = []
    for step, batch in enumerate(mon.wrap(loader)):
        with mon.step():
            time.sleep(0.03)
        if step % 20 == 19:
            lines += mon.name_stragglers()  # every rank, the same step: one all-gather
        if phase == "first" and step == 29:
            state = loader.state_dict()
            if rank == 0:
                with open(f"{audit}/state.json", "w") as f:
                    json.dump(state, f)
            break
        if step == 59:
            break
    mon.close()
    loader.close()
    if rank == 0:
        print(json.dumps(lines))
    dist.destroy_process_group()
""")


@pytest.mark.heavy  # torchrun with two processes on gloo, twice (make test-all)
def test_two_ranks_under_torchrun_name_the_slow_one_and_serve_every_sample_once(small_shards, tmp_path):  # noqa: F811
    script = tmp_path / "ranks.py"
    script.write_text(SCRIPT)
    run, audit = tmp_path / "run", tmp_path / "audit"
    audit.mkdir()
    outputs = []
    with serve(small_shards, _Slow) as (url, _, _):
        for phase in ("first", "resume"):
            done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
                                   "2", str(script), small_shards, url, str(run / phase), str(audit), phase],
                                  cwd=ROOT, capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, done.stderr[-3000:]
            outputs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    assert any(line.startswith("STRAGGLER rank 1 on ") and "slowest stage fetch" in line for line in outputs[1])
    report = fleet_report(str(run / "resume"))
    assert report["stragglers"] == [1] and report["ranks"][1]["slowest_stage"] == "fetch"
    audited = audit_folder(str(audit))
    assert audited["clean"], audited["findings"]
    assert audited["datasets"][0]["resumes"][0]["ranks"] == [0, 1]
