"""moto's standalone S3 server on 127.0.0.1 for the tests (a helper, not a test module)."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import time
from typing import Iterator

import pytest


@contextlib.contextmanager
def moto_s3(bucket: str, endpoint_env: bool = False) -> Iterator[tuple[str, object]]:
    """(endpoint, boto3 client) of a fresh server holding an empty `bucket`; test credentials in the environment
    (and the endpoint in AWS_ENDPOINT_URL when `endpoint_env`), all restored afterwards. s3fs's cached
    filesystems are dropped on the way in and out: one cached by an earlier test knows another endpoint."""
    import s3fs

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    sock.close()
    moto = os.path.join(os.path.dirname(sys.executable), "moto_server")
    proc = subprocess.Popen([moto, "-H", "127.0.0.1", "-p", str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    endpoint = f"http://127.0.0.1:{port}"
    env = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
           "AWS_EC2_METADATA_DISABLED": "true", **({"AWS_ENDPOINT_URL": endpoint} if endpoint_env else {})}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        import boto3

        client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
        for _ in range(600):
            if proc.poll() is not None:
                pytest.fail("moto_server exited at start")
            try:
                client.create_bucket(Bucket=bucket)
                break
            except Exception:
                time.sleep(0.05)
        yield endpoint, client
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
        proc.terminate()
        proc.wait(timeout=30)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def shard_gets(monkeypatch, suffix: str = ".arrow") -> list:
    """From now on, the `Range` of every GET that s3fs makes for an object ending in `suffix` (None: the whole
    object), in the order made."""
    import s3fs

    gets: list = []
    real = s3fs.S3FileSystem._call_s3

    async def counting(self, method, *a, **kw):
        if method == "get_object" and kw.get("Key", "").endswith(suffix):
            gets.append(kw.get("Range"))
        return await real(self, method, *a, **kw)

    monkeypatch.setattr(s3fs.S3FileSystem, "_call_s3", counting)
    return gets
