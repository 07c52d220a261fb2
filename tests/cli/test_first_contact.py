"""A server that accepts connections and never answers, at a dataset's first contact (its manifest): a
warning once a read timeout has passed, and one `UnreachableError` line when the first-contact budget
(DATAFLOW_FIRST_CONTACT_S or `first_contact_s=`) is spent, not minutes of silent retries.

The server is a socket on 127.0.0.1 that accepts and then says nothing; budgets are seconds here.
"""

import logging
import os
import socket
import subprocess
import sys
import threading
import time

import pytest

from dataflow import ConfigError, StreamingDataset, UnreachableError
from dataflow.formats import remote


@pytest.fixture
def silent_server():
    """http://127.0.0.1:PORT/ds: connections are accepted and held open; nothing is ever sent."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held, stop = [], threading.Event()

    def accept():
        srv.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = srv.accept()
            except OSError:
                continue
            held.append(conn)

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{srv.getsockname()[1]}/ds"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    srv.close()


def _first_contact(url, caplog, **kwargs):
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="dataflow"):
        with pytest.raises(UnreachableError) as err:
            StreamingDataset(url, seq_len=8, **kwargs)
    took = time.monotonic() - t0
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING and url in r.getMessage()]
    return str(err.value), took, warnings


@pytest.mark.timing  # a wall-clock bound on a budget: a loaded machine may pass it
@pytest.mark.parametrize("read_timeout", ["0.3", "60"])
def test_a_silent_server_fails_within_the_first_contact_budget(silent_server, caplog, monkeypatch, read_timeout):
    """With a long read timeout (the default 60 s) one request alone would outlast the budget; with a short
    one the retries would. Either way the budget bounds the wait."""
    monkeypatch.setenv("DATAFLOW_FIRST_CONTACT_S", "2")
    monkeypatch.setenv("DATAFLOW_READ_TIMEOUT_S", read_timeout)
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    msg, took, warnings = _first_contact(silent_server, caplog)
    assert f"{silent_server}/index.json: no answer in 2 s" in msg and "DATAFLOW_FIRST_CONTACT_S" in msg
    assert "\n" not in msg
    assert took < 2 + 5  # the budget, plus the time to make a dataset and tear a thread down
    if read_timeout == "0.3":  # a read timeout passed in silence before the budget: said once, at WARNING
        assert len(warnings) == 1 and "no answer in 0.3 s" in warnings[0].getMessage()


@pytest.mark.timing  # a wall-clock bound on a budget: a loaded machine may pass it
def test_the_budget_is_an_argument_too(silent_server, caplog, monkeypatch):
    monkeypatch.setenv("DATAFLOW_FIRST_CONTACT_S", "600")
    monkeypatch.setenv("DATAFLOW_READ_TIMEOUT_S", "0.2")
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    msg, took, warnings = _first_contact(silent_server, caplog, first_contact_s=1.0)
    assert "no answer in 1 s" in msg and took < 1 + 5
    assert len(warnings) == 1


@pytest.mark.timing  # a wall-clock bound on a budget: a loaded machine may pass it
def test_the_cli_says_it_in_one_line_and_exits_2(silent_server):
    env = {"DATAFLOW_FIRST_CONTACT_S": "1.5", "DATAFLOW_READ_TIMEOUT_S": "0.5"}
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "dataflow", "inspect", silent_server], capture_output=True, text=True,
                         env={**os.environ, **env}, timeout=120)
    assert out.returncode == 2, out.stderr
    lines = [line for line in out.stderr.splitlines() if "no answer in 1.5 s" in line]
    assert len(lines) == 1 and "DATAFLOW_FIRST_CONTACT_S" in lines[0]
    assert time.monotonic() - t0 < 1.5 + 30  # the budget; the rest is the interpreter starting


def test_a_bad_budget_is_one_line(monkeypatch, silent_server):
    monkeypatch.setenv("DATAFLOW_FIRST_CONTACT_S", "soon")
    monkeypatch.setenv("DATAFLOW_READ_TIMEOUT_S", "0.2")  # never a long wait, should the budget be ignored
    monkeypatch.setattr(remote, "BACKOFF_S", 0.01)
    with pytest.raises(ConfigError, match="DATAFLOW_FIRST_CONTACT_S='soon' is not a number"):
        StreamingDataset(silent_server, seq_len=8)
