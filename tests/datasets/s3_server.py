"""A real S3-compatible server for the remote-dataset tests, started by the tests themselves.

moto's server (`moto[server]`, PyPI): a pip-installable S3 implementation that speaks real HTTP
with real SigV4 signing, range GETs and 404/403 errors, runs in-process on a random free port and
needs no Docker or binary download (MinIO is a Go binary fetched from its own site, which CI
cannot reach). `s3_server` is session-scoped: one server for the module's tests, fake keys in
AWS_* (what our client and boto3 read), each test in its own bucket.

`denied_s3_server`: moto in a child process with request authentication on
(INITIAL_NO_AUTH_ACTION_COUNT=0), so any key it never issued gets a real 403.

`CuttingProxy`: a TCP proxy in front of the server that cuts the first `cut_first` connections
after `after_bytes` bytes of response: a connection dropped mid-shard (the body ends early).
"""
from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

FAKE_KEYS = {"AWS_ACCESS_KEY_ID": "testing-key-id", "AWS_SECRET_ACCESS_KEY": "testing-secret-1234",
             "AWS_DEFAULT_REGION": "us-east-1", "AWS_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class S3:
    endpoint: str
    requests: list  # (method, path, Range header, access key id that signed it) of each request

    def env(self, endpoint: str | None = None) -> dict:
        """os.environ for a child process (the CLI, a rank) that talks to this server."""
        return {**os.environ, **FAKE_KEYS, "AWS_ENDPOINT_URL": endpoint or self.endpoint}

    def client(self):
        import boto3
        return boto3.client("s3", endpoint_url=self.endpoint, **_boto_keys())

    def upload(self, folder: Path, bucket: str, prefix: str = "data") -> str:
        """Uploads every file of `folder` (as `aws s3 sync` would); returns the s3:// URL."""
        s3 = self.client()
        s3.create_bucket(Bucket=bucket)
        for path in sorted(Path(folder).iterdir()):
            if path.is_file():
                s3.upload_file(str(path), bucket, f"{prefix}/{path.name}")
        return f"s3://{bucket}/{prefix}"


def _boto_keys() -> dict:
    return {"aws_access_key_id": FAKE_KEYS["AWS_ACCESS_KEY_ID"],
            "aws_secret_access_key": FAKE_KEYS["AWS_SECRET_ACCESS_KEY"],
            "region_name": FAKE_KEYS["AWS_DEFAULT_REGION"]}


@pytest.fixture(scope="session")
def s3_server():
    from moto.server import ThreadedMotoServer
    from werkzeug.serving import WSGIRequestHandler

    requests: list = []
    original = WSGIRequestHandler.log_request

    def log_request(handler, code="-", size="-"):  # the server's own request log, kept
        signed_by = re.search(r"Credential=([^/,\s]+)", handler.headers.get("Authorization", ""))
        requests.append((handler.command, handler.path, handler.headers.get("Range"),
                         signed_by and signed_by.group(1)))

    WSGIRequestHandler.log_request = log_request
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=free_port(), verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    saved = {k: os.environ.get(k) for k in (*FAKE_KEYS, "AWS_ENDPOINT_URL")}
    os.environ.update(FAKE_KEYS, AWS_ENDPOINT_URL=endpoint)
    try:
        yield S3(endpoint, requests)
    finally:
        server.stop()
        WSGIRequestHandler.log_request = original
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.fixture(scope="session")
def denied_s3_server():
    """An endpoint that refuses every key (moto with authentication on, in a child)."""
    port = free_port()
    env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": "0"}
    child = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p",
                              str(port)], env=env, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        else:
            raise RuntimeError("moto's server did not start in 30 s")
        yield f"http://127.0.0.1:{port}"
    finally:
        child.terminate()
        child.wait(timeout=10)


class CuttingProxy:
    """127.0.0.1:port -> target; the first `cut_first` connections whose response passes
    `after_bytes` are closed there (a reset mid-body). Counts connections and cuts."""

    def __init__(self, target: str, after_bytes: int, cut_first: int = 1):
        host, port = target.split("://", 1)[1].split(":")
        self.target = (host, int(port))
        self.after_bytes, self.cuts_left = after_bytes, cut_first
        self.cuts = self.connections = 0
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.endpoint = f"http://127.0.0.1:{self.port}"
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._listener.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _serve(self, client: socket.socket) -> None:
        upstream = socket.create_connection(self.target, timeout=30)
        threading.Thread(target=self._pipe, args=(client, upstream, None), daemon=True).start()
        self._pipe(upstream, client, self)

    def _pipe(self, src: socket.socket, dst: socket.socket, cutter) -> None:
        sent = 0
        try:
            while data := src.recv(65536):
                if cutter is not None:
                    with self._lock:
                        cut = self.cuts_left > 0 and sent + len(data) > self.after_bytes
                        if cut:
                            self.cuts_left -= 1
                            self.cuts += 1
                    if cut:
                        dst.sendall(data[: max(0, self.after_bytes - sent)])
                        break
                dst.sendall(data)
                sent += len(data)
        except OSError:
            pass
        finally:
            # shutdown, not just close: it wakes the other direction's thread blocked in recv
            # (a plain close would leave the connection open under it, and the client waiting).
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                s.close()
