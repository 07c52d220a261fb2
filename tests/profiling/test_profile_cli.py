"""`dataflow profile` end to end on a small dataset: table, --json, --trace, --plot, --sweep, --config, errors."""

import json
import sys

import pytest

from support.data import write_random_dataset
from dataflow.cli import main as dataflow_main


def main(argv):
    return dataflow_main(["profile", *argv])


@pytest.fixture(scope="module")
def ds(tmp_path_factory):
    return write_random_dataset(tmp_path_factory.mktemp("profile-cli") / "ds", 150, seed=1, min_len=100)


def test_json_trace_and_plot(ds, tmp_path, capsys):
    trace, plot = tmp_path / "run.json", tmp_path / "run.png"
    rc = main([ds, "--batch-size", "4", "--seq-len", "64", "--num-workers", "1", "--step-ms", "2",
               "--batches", "15", "--json", "--trace", str(trace), "--plot", str(plot)])
    assert rc == 0
    report = json.loads(capsys.readouterr().out)
    r = report["result"]
    assert r["run"]["steps"] == 15 and r["capacity"]["batches_per_s"] > 0
    assert r["run"]["verdict"] in ("input-bound", "balanced", "compute-bound")
    assert r["run"]["gpu"]["available"] is False and r["run"]["gpu"]["reason"]
    assert {row["stage"] for row in r["stages"]["stages"]} >= {"read", "shuffle", "collate"}
    assert list(r["stages"]["per_worker"]) == ["worker-0"]
    assert r["advice"] and report["trace"] == str(trace) and report["plot"] == str(plot)

    events = json.loads(trace.read_text())["traceEvents"]
    for e in events:
        assert {"ph", "ts", "pid", "tid", "name"} <= set(e)
        if e["ph"] == "X":
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
    slices = [e for e in events if e["ph"] == "X"]
    names = {e["name"] for e in slices}
    assert {"wait", "step", "batch", "read", "collate"} <= names
    consumer = {(e["pid"], e["tid"]) for e in slices if e["name"] in ("wait", "step")}
    workers = {(e["pid"], e["tid"]) for e in slices if e["name"] == "read"}
    assert len(consumer) == 1 and workers and not workers & consumer  # one track each
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_table_with_sweep(ds, capsys):
    rc = main([ds, "--batch-size", "4", "--seq-len", "64", "--num-workers", "0", "--step-ms", "1",
               "--batches", "8", "--sweep", "num_workers=0,1", "depth=1,2"])
    assert rc == 0
    out = capsys.readouterr().out
    for text in ("capacity", "data wait", "p99", "verdict", "where the loader's time goes", "read",
                 "sweep (4 configurations", "recommended: num_workers="):
        assert text in out


def test_user_mistakes_are_one_line_errors(ds, tmp_path, capsys, monkeypatch):
    assert main([ds, "--batch-size", "0", "--seq-len", "64", "--step-ms", "1"]) == 2
    assert "error: --batch-size must be at least 1" in capsys.readouterr().err
    assert main([ds, "--seq-len", "64", "--step-ms", "1"]) == 2
    assert "--batch-size is required" in capsys.readouterr().err
    assert main([str(tmp_path / "nothing"), "--batch-size", "2", "--seq-len", "8", "--step-ms", "1"]) in (1, 2)
    assert capsys.readouterr().err.count("\n") == 1
    assert main([ds, "--batch-size", "2", "--seq-len", "8", "--step-ms", "1", "--sweep", "threads=1"]) == 2
    for bad in ("nan", "inf", "-5"):  # nan and inf were a traceback (time.sleep's)
        assert main([ds, "--batch-size", "2", "--seq-len", "8", "--step-ms", bad]) == 2
        assert "--step-ms must be a number of milliseconds >= 0" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main([ds, "--batch-size", "2", "--seq-len", "8", "--step-ms", "1", "--plot", str(tmp_path / "x.png")]) == 2
    assert "pip install" in capsys.readouterr().err


def test_config_runs_the_trainer_model_step(ds, tmp_path, capsys):
    pytest.importorskip("trainer.model")
    cfg = tmp_path / "tiny.toml"
    cfg.write_text('[data]\nseq_len = 32\nbatch_size = 2\nnum_workers = 0\n'
                   '[model]\nn_layer = 1\nn_head = 2\nd_model = 32\n[train]\nprecision = "fp32"\ndevice = "cpu"\n')
    assert main([ds, "--config", str(cfg), "--batches", "4", "--json"]) == 0
    r = json.loads(capsys.readouterr().out)["result"]
    assert r["consumer"].startswith("trainer GPT step") and r["run"]["steps"] == 4
    assert r["settings"]["batch_size"] == 2 and r["settings"]["seq_len"] == 32


def test_registered_in_the_dataflow_command():
    from dataflow.cli import build_parser

    args = build_parser().parse_args(["profile", "x", "--batch-size", "1", "--seq-len", "1", "--step-ms", "1"])
    assert args.func.__name__ == "cmd_profile" and args.batch_size == 1 and args.step_ms == 1


def test_config_profiles_the_loader_the_trainer_builds(ds, tmp_path):
    """--config goes through the trainer's own build_data: its shuffle window and document masking count."""
    from dataflow.profiling.consumers import load_target
    from dataflow.profiling.session import RunSettings

    cfg = tmp_path / "masked.toml"
    cfg.write_text('[data]\nseq_len = 32\nbatch_size = 2\nnum_workers = 0\nshuffle_window = 3\ndoc_mask = true\n'
                   '[model]\nn_layer = 1\nn_head = 2\nd_model = 32\n[train]\nprecision = "fp32"\ndevice = "cpu"\n')
    target = load_target(str(cfg))
    assert target.defaults["batch_size"] == 2 and target.defaults["seq_len"] == 32
    s = RunSettings(data=ds, batch_size=2, seq_len=32, num_workers=0, device="cpu")
    loader = target.make_loader(s, persistent_workers=True)
    assert loader.dataset.shuffle_window == 3 and loader.persistent_workers
    assert "position_ids" in next(iter(loader))
