"""The data-order audit (issue 37, item 3): loaders with `audit=DIR` record what each rank served as it was
yielded; `dataflow audit DIR` replays it over ranks, resumes and layout changes, and names the first
duplicated or missing range and the resume it follows. Ranks are simulated in one process with rank=/world_size=
loaders stepping together; the data is the KJV corpus of tests/data written with ShardWriter."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from support.loading import kjv_data  # noqa: F401  (the fixture: KJV documents as byte tokens)
from support.loading import BATCH, SEQ, loaders
from dataflow import StreamingDataLoader, StreamingDataset
from dataflow.audit.replay import audit_folder
from dataflow.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def serve(group, steps=None):
    """Every rank takes `steps` batches in lockstep (None: to the end of the epoch); then they stop cleanly."""
    iterators = [iter(loader) for loader in group]
    taken = 0
    while steps is None or taken < steps:
        batches = [next(it, None) for it in iterators]
        if any(b is None for b in batches):
            break
        taken += 1
    for loader in group:
        loader.close()
    return taken


def first_run(data, audit, steps=5):
    """Two ranks serve `steps` steps; the states after the last step and the one before are returned."""
    group = loaders(data, audit, 2)
    serve(group, steps - 1)
    before = group[0].state_dict()
    serve(group, 1)
    return before, group[0].state_dict()


def audit_cli(folder, capsys, *flags):
    code = main(["audit", str(folder), *flags])
    return code, capsys.readouterr()


def test_a_stop_and_resume_from_2_to_3_ranks_serves_every_sample_once(kjv_data, tmp_path, capsys):
    _, state = first_run(kjv_data, tmp_path)
    assert state["consumed"] == 5 * 2 * BATCH
    serve(loaders(kjv_data, tmp_path, 3, state))
    code, out = audit_cli(tmp_path, capsys, "--json")
    report = json.loads(out.out)
    assert code == 0 and report["clean"] and report["findings"] == []
    total = StreamingDataset(kjv_data, seq_len=SEQ).num_samples
    (epoch,) = report["datasets"][0]["by_epoch"]
    tail = (total - state["consumed"]) % (3 * BATCH)  # the 3-rank walk's drop-last tail
    assert epoch["complete"] and epoch["dropped"] == tail and report["samples"] == total - tail
    (resume,) = report["datasets"][0]["resumes"]
    assert (resume["via"], resume["consumed"], resume["world_size"], resume["ranks"]) == \
        ("load_state_dict", 40, 3, [0, 1, 2])
    code, out = audit_cli(tmp_path, capsys)
    assert code == 0 and out.out.strip().endswith("clean: every sample of each epoch was served exactly once")


def test_a_resume_from_a_state_one_step_old_names_the_duplicated_range_and_the_resume(kjv_data, tmp_path, capsys):
    stale, state = first_run(kjv_data, tmp_path)
    serve(loaders(kjv_data, tmp_path, 3, stale))
    code, out = audit_cli(tmp_path, capsys, "--json")
    report = json.loads(out.out)
    assert code == 1 and not report["clean"]
    (finding,) = report["findings"]
    assert (finding["kind"], finding["epoch"], finding["start"], finding["stop"]) == \
        ("duplicate", 0, stale["consumed"], state["consumed"])  # the one step served again
    assert finding["ranks"] == [0, 1, 2]
    resume = finding["resume"]
    assert (resume["via"], resume["consumed"], resume["world_size"]) == ("load_state_dict", 32, 3)
    assert resume["stopped_at"] == {"epoch": 0, "consumed": 40}  # where a correct resume continues
    code, out = audit_cli(tmp_path, capsys)
    assert code == 1 and "DUPLICATE epoch 0 positions 32-39 (8 samples) served 2 times, by ranks 0, 1, 2, after " \
        "resume #1 (load_state_dict at epoch 0, position 32" in out.out
    assert "stopped cleanly at epoch 0, position 40" in out.out


def test_skipping_a_step_reports_the_missing_range(kjv_data, tmp_path, capsys):
    _, state = first_run(kjv_data, tmp_path)
    ahead = dict(state, consumed=state["consumed"] + 2 * BATCH)  # one 2-rank step further
    serve(loaders(kjv_data, tmp_path, 2, ahead))
    code, out = audit_cli(tmp_path, capsys, "--json")
    (finding,) = json.loads(out.out)["findings"]
    assert code == 1 and (finding["kind"], finding["start"], finding["stop"]) == ("missing", 40, 48)
    assert finding["ranks"] == [0, 1] and finding["resume"]["consumed"] == 48


def test_workers_record_what_was_yielded_not_what_they_read_ahead(kjv_data, tmp_path, capsys):
    group = loaders(kjv_data, tmp_path, 2, workers=2)  # each worker fills batches ahead of the consumer
    serve(group, 3)
    state = group[0].state_dict()
    for rank, loader in enumerate(loaders(kjv_data, tmp_path, 2, state, workers=2)):
        serve([loader])  # one rank after the other: the audit orders by what each rank served
    code, out = audit_cli(tmp_path, capsys, "--json")
    report = json.loads(out.out)
    assert code == 0 and report["clean"], report["findings"]
    assert {r["workers"] for r in report["datasets"][0]["resumes"]} == {2}


def test_a_dataset_iterated_directly_records_ranges_not_samples(kjv_data, tmp_path):
    ds = StreamingDataset(kjv_data, seq_len=SEQ, audit=tmp_path)
    it = iter(ds)
    for _ in range(100):
        next(it)
    state = ds.state_dict()
    del it
    resumed = StreamingDataset(kjv_data, seq_len=SEQ, audit=tmp_path)
    resumed.load_state_dict(state)
    served = sum(1 for _ in resumed)
    resumed._audit_log.close()
    ds._audit_log.close()
    report = audit_folder(str(tmp_path))
    assert report["clean"] and report["samples"] == 100 + served == ds.num_samples
    with open(tmp_path / "audit-rank-0.jsonl") as f:
        assert sum(1 for _ in f) < 30  # one line per run of samples, not one per sample


def test_a_killed_run_resumed_from_its_last_checkpoint_is_clean_and_a_torn_line_is_skipped(kjv_data, tmp_path, capsys):
    """A kill -9 after a checkpoint: the steps served after it are replayed by the resume, legitimately."""
    script = textwrap.dedent(f"""
        import json, os, signal, sys
        sys.path.insert(0, {os.path.join(ROOT, 'tests')!r})
        from support.loading import loaders
        group = loaders({kjv_data!r}, {str(tmp_path)!r}, 2)
        its = [iter(l) for l in group]
        for _ in range(5):
            [next(it) for it in its]
        states = [l.state_dict() for l in group]  # a checkpoint: each rank's audit records up to it are written
        with open({str(tmp_path / 'state.json')!r}, "w") as f:
            json.dump(states[0], f)
        import dataflow.audit.log
        dataflow.audit.log.FLUSH_S = 0  # as if a second went by: each step's record is written as it is served
        for _ in range(3):
            [next(it) for it in its]  # served, then rolled back with the kill
        with open({str(tmp_path / 'audit-rank-1.jsonl')!r}, "a") as f:
            f.write('{{"kind": "steps", "sess')  # a write cut short
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    done = subprocess.run([sys.executable, "-c", script], cwd=ROOT, timeout=120)
    assert done.returncode == -9
    with open(tmp_path / "state.json") as f:
        state = json.load(f)
    serve(loaders(kjv_data, tmp_path, 3, state))
    code, out = audit_cli(tmp_path, capsys, "--json")
    report = json.loads(out.out)
    assert code == 0 and report["clean"], report["findings"]
    (torn,) = report["unreadable"]
    assert (torn["file"], torn["why"]) == ("audit-rank-1.jsonl", "not a whole JSON record (a write cut short)")
    lines = (tmp_path / "audit-rank-1.jsonl").read_text().splitlines()
    assert json.loads(lines[torn["line"]])["kind"] == "session"  # the resumed run's writer started a new line
    assert report["datasets"][0]["replayed"] > 0


def test_a_record_lost_before_the_checkpoint_is_reported_missing_not_corrupt(kjv_data, tmp_path, capsys):
    _, state = first_run(kjv_data, tmp_path)
    path = tmp_path / "audit-rank-1.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    steps = [i for i, line in enumerate(lines) if '"kind":"steps"' in line]
    lost = json.loads(lines[steps[-1]])["pos"]
    path.write_text("".join(lines[:steps[-1]]) + lines[steps[-1]][:40])  # rank 1's last run torn, the rest lost
    serve(loaders(kjv_data, tmp_path, 2, state))
    code, out = audit_cli(tmp_path, capsys, "--json")
    report = json.loads(out.out)
    assert code == 1 and len(report["unreadable"]) == 1
    (finding,) = report["findings"]
    assert (finding["kind"], finding["start"], finding["stop"], finding["stride"], finding["ranks"]) == \
        ("missing", lost[0], lost[1], 2, [1])  # rank 1's share of the step, one range
    assert finding["resume"] is None  # the resume continued where the fleet stood: the records were lost
    code, out = audit_cli(tmp_path, capsys)
    assert "their records are lost" in out.out


@pytest.mark.parametrize("folder", ["missing-folder", "empty"])
def test_a_folder_without_audit_files_is_a_one_line_usage_error(tmp_path, capsys, folder):
    (tmp_path / "empty").mkdir()
    code, out = audit_cli(tmp_path / folder, capsys)
    assert code == 2 and out.out == "" and len(out.err.strip().splitlines()) == 1
    assert "audit=" in out.err


def test_a_dataset_under_torch_dataloader_workers_records_a_file_per_worker(kjv_data, tmp_path):
    from torch.utils.data import DataLoader

    ds = StreamingDataset(kjv_data, seq_len=8 * SEQ, audit=tmp_path)  # fewer, longer samples: a short epoch
    served = sum(1 for _ in DataLoader(ds, batch_size=None, num_workers=2))
    report = audit_folder(str(tmp_path))
    assert report["clean"] and served == report["samples"] == ds.num_samples
    assert report["files"] == ["audit-rank-0-worker-0.jsonl", "audit-rank-0-worker-1.jsonl"]


def _read_ahead_run(data, audit, deferred):
    """A downstream that holds 3 batches ahead of its user (as DevicePrefetcher does): the user takes 5, the
    checkpoint is the state after the user's fifth batch, then both stop; the resume goes on from there."""
    group = loaders(data, audit, 2)
    told = [loader.audit_on_yield() if deferred else None for loader in group]
    iterators = [iter(loader) for loader in group]
    states = []
    for step in range(8):  # pulled from the loaders: 3 of them never reach the user
        [next(it) for it in iterators]
        states.append(group[0].state_dict())
        if step >= 3:  # the user takes the batch pulled 3 steps ago
            for yielded in told:
                if yielded is not None:
                    yielded()
    for loader in group:
        loader.close()
    user_state = states[4]  # after the user's fifth batch
    serve(loaders(data, audit, 2, user_state))
    return audit_folder(str(audit))


def test_batches_a_downstream_read_ahead_are_served_when_it_yields_them(kjv_data, tmp_path):
    report = _read_ahead_run(kjv_data, tmp_path / "told", deferred=True)
    assert report["clean"], report["findings"]
    report = _read_ahead_run(kjv_data, tmp_path / "untold", deferred=False)  # the loader's own yield counts
    (finding,) = report["findings"]
    assert (finding["kind"], finding["start"], finding["stop"]) == ("duplicate", 40, 64)


def test_epochs_of_a_cycling_loader_without_drop_last_are_each_judged(kjv_data, tmp_path):
    def group(state=None):
        out = []
        for rank in range(2):
            loader = StreamingDataLoader(StreamingDataset(kjv_data, seq_len=SEQ, rank=rank, world_size=2),
                                         batch_size=BATCH, drop_last=False, cycle=True, audit=tmp_path)
            if state is not None:
                loader.load_state_dict(state)
            out.append(loader)
        return out

    first = group()
    per_epoch = len(first[0])
    serve(first, per_epoch + per_epoch // 2)  # into the middle of epoch 1
    state = first[0].state_dict()
    serve(group(state), per_epoch)  # on into the middle of epoch 2
    report = audit_folder(str(tmp_path))
    assert report["clean"], report["findings"]
    total = first[0].dataset.num_samples
    e0, e1, e2 = report["datasets"][0]["by_epoch"]
    assert e0["complete"] and e1["complete"] and not e2["complete"]
    assert e0["dropped"] == e1["dropped"] == total % 2  # without drop_last only the ranks' remainder is left
    assert e0["served"] == e1["served"] == total - total % 2


def test_a_downstream_yielding_an_epochs_last_batches_after_the_loader_closed_it_is_audited(kjv_data, tmp_path):
    loader = StreamingDataLoader(StreamingDataset(kjv_data, seq_len=8 * SEQ), batch_size=BATCH, audit=tmp_path)
    yielded = loader.audit_on_yield()
    pulled = list(loader)  # the whole epoch pulled ahead: the loader closes itself at its end
    for _ in pulled:
        yielded()  # ...then each batch reaches the user
    loader.close()
    report = audit_folder(str(tmp_path))
    assert report["clean"] and report["datasets"][0]["by_epoch"][0]["complete"], report["findings"]


def test_set_epoch_before_each_epoch_is_no_resume_and_repeating_an_epoch_is_a_duplicate(kjv_data, tmp_path, capsys):
    loader = StreamingDataLoader(StreamingDataset(kjv_data, seq_len=8 * SEQ), batch_size=BATCH, audit=tmp_path)
    for epoch in range(2):  # the usual loop: set_epoch, then the epoch
        loader.set_epoch(epoch)
        for _ in loader:
            pass
    report = audit_folder(str(tmp_path))
    assert report["clean"] and report["epochs"] == 2 and report["datasets"][0]["resumes"] == []
    loader.set_epoch(1)  # epoch 1 once more
    for _ in loader:
        pass
    code, out = audit_cli(tmp_path, capsys, "--json")
    (finding,) = json.loads(out.out)["findings"]
    assert code == 1 and (finding["kind"], finding["epoch"], finding["start"]) == ("duplicate", 1, 0)
    assert finding["resume"]["via"] == "set_epoch"


@pytest.mark.parametrize("told", [True, False])
def test_a_device_prefetcher_reading_ahead_is_audited_as_its_user_takes_batches(kjv_data, tmp_path, told, monkeypatch):
    """DevicePrefetcher holds `depth` batches ahead of the training loop: its checkpoint (its state_dict, the
    position after the batch it last yielded) resumed on 2 ranks serves every sample once, because it tells the
    loader's audit as each batch reaches the user. Without that hand-over, its read-ahead shows as duplicates."""
    from dataflow import DevicePrefetcher

    if not told:
        monkeypatch.setattr(StreamingDataLoader, "audit_on_yield", lambda self: None)
    prefetchers = [DevicePrefetcher(loader, device="cpu", depth=3) for loader in loaders(kjv_data, tmp_path, 2)]
    iterators = [iter(p) for p in prefetchers]
    for _ in range(5):
        [next(it) for it in iterators]
    state = prefetchers[0].state_dict()
    for p in prefetchers:
        p.close()
        p.upstream.close()
    serve(loaders(kjv_data, tmp_path, 2, state))
    report = audit_folder(str(tmp_path))
    if told:
        assert report["clean"], report["findings"]
    else:
        # how far each rank's thread had read ahead when closed is timing: one range of duplicates or one a rank
        kinds = [f["kind"] for f in report["findings"]]
        assert kinds and set(kinds) == {"duplicate"}, report["findings"]
