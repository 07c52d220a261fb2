"""A loader that has produced nothing for `watchdog_s` seconds logs what each of its processes is doing (issue 37,
item 4): the batch awaited, each worker's OS figures, its Python stack and the stage it is in. The hang is real:
a stage hook (it runs where the batch is built) that sleeps in Python on one batch."""

import logging
import signal
import time

import pytest

from dataflow import ConfigError, StreamingDataLoader, StreamingDataset
from support.loading import kjv_data  # noqa: F401  (the fixture: KJV documents as byte tokens)

HANG_S = 3.0
_calls = {"n": 0}


def _hang_on_the_third_batch(timing) -> None:
    """A stage hook stuck in Python on the third batch this process builds."""
    _calls["n"] += 1
    if _calls["n"] == 3:
        time.sleep(HANG_S)


def _reports(caplog):
    return [r.getMessage() for r in caplog.records if "no batch for" in r.getMessage()]


@pytest.mark.parametrize("workers, reset_by_a_framework", [(0, False), (1, False), (1, True)])
def test_a_stalled_loader_logs_what_its_processes_are_doing(kjv_data, caplog, workers, reset_by_a_framework):  # noqa: F811
    _calls["n"] = 0
    if reset_by_a_framework:  # an earlier loader's handler, then what Lightning's teardown does to every signal
        from dataflow.loading import watchdog
        StreamingDataLoader(StreamingDataset(kjv_data, seq_len=64), num_workers=1, watchdog_s=1,
                            multiprocessing_context="fork")._watchdog.prepare_fork()
        signal.signal(watchdog.STACK_SIGNAL, signal.getsignal(watchdog.STACK_SIGNAL))  # SIG_DFL: Python sees no handler
    # fork named: a worker's Python stack comes through the handler it inherits (spawned ones give the OS figures
    # only), and another test of the same process may have changed the default start method
    loader = StreamingDataLoader(StreamingDataset(kjv_data, seq_len=64), batch_size=4, num_workers=workers,
                                 prefetch_factor=1 if workers else None, held_batches=0,
                                 stage_hook=_hang_on_the_third_batch, watchdog_s=1,
                                 multiprocessing_context="fork" if workers else None)
    caplog.set_level(logging.WARNING, logger="dataflow.loading.watchdog")
    it = iter(loader)
    for _ in range(8):
        next(it)
    loader.close()
    reports = _reports(caplog)  # (a slow first batch on a busy machine is reported too)
    (report, *_) = [r for r in reports if "_hang_on_the_third_batch" in r]
    assert report.startswith(f"StreamingDataLoader({kjv_data}, rank 0 of 1): no batch for ")
    assert "waiting for batch " in report and " of epoch 0" in report
    who = "this process (pid" if workers == 0 else "worker 0 (pid"
    assert who in report and "CPU s" in report and "MB read" in report
    assert "stage: outside dataflow, in _hang_on_the_third_batch (test_loader_watchdog.py:" in report
    assert "called from dataflow/loading/" in report and "most recent call last" in report


def test_a_loader_that_keeps_up_logs_nothing_and_zero_turns_it_off(kjv_data, caplog, monkeypatch):  # noqa: F811
    caplog.set_level(logging.WARNING, logger="dataflow.loading.watchdog")
    # 60 s: far past any batch of this loader, however loaded the machine (1 s was passed by a first batch)
    for batch in StreamingDataLoader(StreamingDataset(kjv_data, seq_len=64), batch_size=4, watchdog_s=60):
        pass
    assert _reports(caplog) == []
    monkeypatch.setenv("DATAFLOW_WATCHDOG_S", "0")
    assert StreamingDataLoader(StreamingDataset(kjv_data, seq_len=64))._watchdog is None


@pytest.mark.parametrize("value, where", [("-1", "env"), ("soon", "env"), (-1, "argument")])
def test_a_watchdog_setting_that_cannot_work_is_one_line(kjv_data, monkeypatch, value, where):  # noqa: F811
    ds = StreamingDataset(kjv_data, seq_len=64)
    if where == "env":
        monkeypatch.setenv("DATAFLOW_WATCHDOG_S", value)
        with pytest.raises(ConfigError, match="DATAFLOW_WATCHDOG_S") as e:
            StreamingDataLoader(ds)
    else:
        with pytest.raises(ConfigError, match="watchdog_s must be") as e:
            StreamingDataLoader(ds, watchdog_s=value)
    assert "\n" not in str(e.value)


def test_a_worker_without_the_stack_handler_is_never_signalled(kjv_data):  # noqa: F811
    """The stack dump is asked of a worker by a signal whose default action ends a process: a worker that has
    no handler for it (spawned, or not yet started) gets no signal, and the report goes on with the OS figures."""
    import multiprocessing

    from dataflow.loading import watchdog

    child = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(30,))
    child.start()
    try:
        dog = watchdog.Watchdog(1, "test", lambda: [child.pid])
        dog.prepare_fork()  # the handler is this process's; the spawned child has none
        assert watchdog._catches(child.pid, watchdog.STACK_SIGNAL) is False
        assert dog._worker_stack(child.pid) == []
        time.sleep(0.2)
        assert child.is_alive()  # not ended by the signal
    finally:
        child.kill()
        child.join()
