"""The common mistakes: one line on stderr and exit 2 from the CLI, a `DataflowError` subclass in Python,
and the full traceback only with --debug or DATAFLOW_DEBUG=1."""

import os
import socket
import subprocess
import sys

import pytest

from support.data import KJV
from support.cli import run as run_dataflow  # the one way the tests start `dataflow`
from dataflow.cli import main
from dataflow.errors import (ConfigError, CredentialsError, DataflowError, MissingDependencyError,
                             NotADatasetError, UnreachableError)
from dataflow.formats.manifest import read_manifest


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def cli(capsys, *argv: str) -> tuple[int, str]:
    """Exit code and stderr of `dataflow ARGV`; stderr must be exactly one line."""
    code = main(list(argv))
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return code, err


def run(*argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return run_dataflow(*argv, timeout=180, env=env)


def clean_env(**extra: str) -> dict:
    """The environment without any AWS credentials, config files or instance metadata."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(AWS_CONFIG_FILE=os.devnull, AWS_SHARED_CREDENTIALS_FILE=os.devnull, AWS_EC2_METADATA_DISABLED="true",
               AWS_DEFAULT_REGION="us-east-1", DATAFLOW_DEBUG="", **extra)
    return env


# --- a path that is not a dataset ----------------------------------------------------------------
@pytest.mark.parametrize("command", ["inspect", "verify", "decode"])
def test_raw_corpus_given_as_a_dataset(capsys, command):
    code, err = cli(capsys, command, str(KJV))
    assert code == 2
    assert str(KJV) in err and "is a file, not a dataset" in err and "dataflow tokenize" in err


def test_missing_path_empty_folder_and_jsonl_named_json(capsys, tmp_path):
    code, err = cli(capsys, "inspect", str(tmp_path / "nope"))
    assert code == 2 and "no such file or folder" in err and "nope" in err
    code, err = cli(capsys, "verify", str(tmp_path))
    assert code == 2 and "no manifest here" in err and "dataflow tokenize" in err
    code, err = cli(capsys, "inspect", f"file://{tmp_path}")
    assert code == 2 and f"{tmp_path}/index.json: no manifest here" in err
    lines = tmp_path / "corpus.json"
    lines.write_text('{"text": "a"}\n{"text": "b"}\n')
    code, err = cli(capsys, "decode", str(lines))
    assert code == 2 and "corpus.json is not a dataflow manifest" in err
    lines.write_text('{"text": "a"}\n')
    code, err = cli(capsys, "inspect", str(lines))
    assert code == 2 and "not a dataflow manifest" in err


def test_python_api_raises_not_a_dataset(tmp_path):
    from dataflow import StreamingDataset

    with pytest.raises(NotADatasetError, match="is a file, not a dataset") as e:
        StreamingDataset(str(KJV), seq_len=16)
    assert isinstance(e.value, ConfigError) and e.value.__cause__ is None  # no chained traceback by default
    with pytest.raises(NotADatasetError, match="no manifest here"):
        read_manifest(str(tmp_path))


def test_trainer_data_path_to_a_raw_corpus_is_one_line_and_exit_2(capsys):
    from trainer.__main__ import main as trainer_main

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = trainer_main(["--config", os.path.join(root, "configs", "demo.toml"), "--set", f"data.path={KJV}",
                         "--set", "log.jsonl="])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "is a file, not a dataset" in err


# --- remote storage -------------------------------------------------------------------------------
def test_gs_without_gcsfs_names_the_extra(capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # `import gcsfs` now fails as if it were not installed
    code, err = cli(capsys, "inspect", "gs://bucket/data/train")
    assert code == 2 and "gcsfs" in err and "pip install 'dataflow-lm[gcs]'" in err
    with pytest.raises(MissingDependencyError, match="gcsfs"):
        read_manifest("gs://bucket/data/train")
    from dataflow.loading.storage import Storage

    with pytest.raises(MissingDependencyError, match=r"dataflow-lm\[gcs\]"):
        Storage("gs://bucket/data/train", cache_limit="1GB")._filesystem()


def test_unknown_scheme_is_a_usage_error(capsys):
    code, err = cli(capsys, "inspect", "nosuchscheme://bucket/ds")
    assert code == 2 and "unknown URL scheme 'nosuchscheme'" in err


def test_s3_without_credentials_cli_and_python(tmp_path, monkeypatch):
    """botocore's real NoCredentialsError, against an endpoint on 127.0.0.1 (refused before connecting)."""
    endpoint = f"http://127.0.0.1:{closed_port()}"
    p = run("inspect", "s3://bucket/data/train", env=clean_env(AWS_ENDPOINT_URL=endpoint))
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "s3://bucket/data/train" in p.stderr and "no credentials" in p.stderr
    assert "AWS_ACCESS_KEY_ID" in p.stderr and "Traceback" not in p.stderr
    for k in [k for k in os.environ if k.startswith("AWS_")]:
        monkeypatch.delenv(k)
    for k, v in clean_env().items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    opts = {"skip_instance_cache": True, "client_kwargs": {"endpoint_url": endpoint}}
    with pytest.raises(CredentialsError, match="no credentials"):
        read_manifest("s3://bucket/data/train", storage_options=opts)


def test_unreachable_http_host_is_not_reported_as_no_manifest(capsys):
    url = f"http://127.0.0.1:{closed_port()}/data/train"
    code, err = cli(capsys, "inspect", url)
    assert code == 2 and "cannot reach 127.0.0.1" in err and "no manifest" not in err
    with pytest.raises(UnreachableError, match="cannot reach"):
        read_manifest(url)


def test_unreachable_s3_endpoint(tmp_path):
    endpoint = f"http://127.0.0.1:{closed_port()}"
    env = clean_env(AWS_ENDPOINT_URL=endpoint, AWS_ACCESS_KEY_ID="k", AWS_SECRET_ACCESS_KEY="s",
                    AWS_MAX_ATTEMPTS="1")
    p = run("inspect", "s3://bucket/data/train", env=env)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert "cannot reach the s3:// endpoint" in p.stderr and endpoint in p.stderr


# --- --debug --------------------------------------------------------------------------------------
def test_debug_flag_and_env_show_the_traceback_with_its_cause(tmp_path):
    for argv, env in ((["--debug", "inspect", str(KJV)], None), (["inspect", str(KJV), "--debug"], None),
                      (["inspect", str(KJV)], dict(os.environ, DATAFLOW_DEBUG="1"))):
        p = run(*argv, env=env)
        assert p.returncode != 0 and "Traceback" in p.stderr
        assert "NotADirectoryError" in p.stderr and "NotADatasetError" in p.stderr  # the original cause kept
    p = run("inspect", str(KJV), env=dict(os.environ, DATAFLOW_DEBUG="0"))
    assert p.returncode == 2 and "Traceback" not in p.stderr


def test_every_user_error_is_a_dataflow_error():
    for cls in (NotADatasetError, MissingDependencyError, CredentialsError, UnreachableError):
        assert issubclass(cls, ConfigError) and issubclass(cls, DataflowError)



def test_server_error_on_the_manifest_is_one_line_exit_1(capsys):
    import http.server
    import threading

    class Failing(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(500)
            self.end_headers()

        do_HEAD = do_GET  # noqa: N815

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Failing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/data/train"
        code, err = cli(capsys, "inspect", url)
        assert code == 1 and f"{url}/index.json: cannot read it" in err and "500" in err
    finally:
        server.shutdown()
