"""Reading objects from s3://, gs://, az:// and https:// URLs through obstore, in one place.

Why obstore (Rust's object_store): bench/bench_remote.py measured whole-shard downloads
1.2-1.8x faster than fsspec + s3fs against the same local S3 server (32 MiB objects, best of 3
rounds, three runs on the 2-core box: 674 vs 369, 656 vs 544, 638 vs 474 MB/s), small range
reads (header + metadata table) about as fast (46-49 vs 49-53 ms: the server's time), and one
package speaks S3, GCS, Azure and plain HTTP(S) with request retries built in. Its one catch:
its runtime does not survive fork(), so a forked DataLoader worker downloads through a fresh
process (`Store._in_fresh_process`; s3fs resets its event loop after fork instead).

Credentials come only from where each cloud's own tools look: for S3 the AWS_* variables
(AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL for
MinIO, Ceph and other S3-compatible stores), else boto3's chain (AWS_PROFILE, ~/.aws/credentials
and config, SSO, instance roles) when boto3 is installed; for GCS and Azure obstore's own
(GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*). Nothing here prints them: every error is
one line naming the URL and the HTTP status, never a header, a signature or obstore's dump.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

from turbotrain.datasets.errors import DatasetError
from turbotrain.printable import printable

from .read_limits import Deadline
from .urls import join, shown_url

INSTALL = "pip install 'turbotrain[remote]'"
# A shard download that breaks mid-way resumes from its last byte; this many tries in a row
# without a byte of progress, each after a longer pause, end it (and its deadline always does:
# read_limits.py).
ATTEMPTS = 5
BACKOFF_S = 0.5
# obstore's default request timeout (30 s) covers the whole body: a 1 GB shard at 30 MB/s would
# never finish. A download that times out resumes where it stopped (see ATTEMPTS); each read's
# own deadline (read_limits.py) is what bounds it.
CLIENT_OPTIONS = {"timeout": "300s", "connect_timeout": "10s"}
# Request-level retries inside obstore (connection refused, 5xx, throttling), before ours.
RETRY = {"max_retries": 4, "retry_timeout": timedelta(seconds=60),
         "backoff": {"init_backoff": timedelta(milliseconds=200),
                     "max_backoff": timedelta(seconds=5), "base": 2}}
STREAM_CHUNK = 1 << 20  # 1 MiB: with 8 MiB chunks bench_remote fell from 674 to ~220 MB/s


class Store:
    """The objects under one URL prefix; `get_range`, `size` and `download` take names
    relative to it. Pickles as its URL (each process makes its own client).

    Every byte goes through `_receive`: counted as it arrives (a body longer than asked for is
    refused at its first extra chunk, never buffered) and held to its read's `Deadline`
    (read_limits.py). obstore's async API is what lets a deadline stop a read: a sync stream
    blocks inside Rust until its chunk is full, however slowly it fills, while cancelling the
    awaited future drops the request and closes its connection."""

    def __init__(self, url: str):
        self.url = url.rstrip("/")
        self._store = None

    def __getstate__(self) -> dict:
        return {"url": self.url, "_store": None}

    @property
    def store(self):
        if self._store is None:
            self._store = _make_store(self.url)
        return self._store

    def shown(self, name: str) -> str:
        return shown_url(join(self.url, name))

    def size(self, name: str) -> int:
        if forked_after_use():
            return int(self._in_fresh_process(Deadline(0), "size", name))
        obstore = _obstore(self.url)
        deadline = Deadline(0)

        async def head():
            try:
                async with asyncio.timeout_at(deadline.due(0)):
                    return await obstore.head_async(self.store, name)
            except TimeoutError:
                raise deadline.missed(self.shown(name), 0) from None
            except Exception as e:  # obstore's own classes, mapped by kind
                raise _as_dataset_error(e, join(self.url, name)) from None
        meta = self._retrying(name, deadline, lambda: _run(head()))
        size = meta["size"]
        if not (type(size) is int and 0 <= size < 2**62):
            raise DatasetError(f"{self.shown(name)}: the server gives its size as {size!r:.40}")
        return size

    def get_range(self, name: str, start: int, end: int) -> bytes:
        """Bytes [start, end) of object `name` (one HTTP range request), never more."""
        if end <= start:
            return b""
        _obstore(self.url)
        deadline = Deadline(end - start)

        def attempt() -> bytes:
            pieces: list[bytes] = []
            _run(self._receive(name, {"range": (start, end)}, deadline, 0, end - start,
                               pieces.append))
            return b"".join(pieces)
        data = self._retrying(name, deadline, attempt)
        if len(data) != end - start:
            raise DatasetError(f"{self.shown(name)}: asked for bytes {start}..{end}, got "
                               f"{len(data)}; the object changed or is shorter than "
                               f"dataset.json says")
        return data

    def download(self, name: str, f, nbytes: int, on_chunk: Callable[[bytes], None]) -> None:
        """Writes object `name` (nbytes long) into the open file f from its start, resuming
        with a range request after a connection dropped mid-way; `on_chunk` sees every byte
        once, in order (the caller's checksum). The whole download, resumptions included,
        has one deadline."""
        deadline = Deadline(nbytes)
        if forked_after_use():
            self._in_fresh_process(deadline, "download", name, str(nbytes), fd=f.fileno())
            f.seek(0)
            while chunk := f.read(1 << 22):  # from the page cache: ~2 GB/s, once per shard
                on_chunk(chunk)
            return
        _obstore(self.url)
        done, failures = 0, 0

        def sink(chunk: bytes) -> None:
            nonlocal done
            f.write(chunk)
            on_chunk(chunk)
            done += len(chunk)

        while done < nbytes:
            before = done
            try:
                options = {"range": {"offset": done}} if done else {}
                _run(self._receive(name, options, deadline, done, nbytes - done, sink))
                if done < nbytes:
                    raise _Transient(f"the object ended after {done} of {nbytes} bytes")
            except Exception as e:  # a dropped connection surfaces as obstore's or an OSError
                if isinstance(e, DatasetError) and not isinstance(e, _Transient):
                    raise  # 404, 403, a wrong length, too slow: retrying cannot help
                failures = 0 if done > before else failures + 1
                if failures >= ATTEMPTS:
                    raise DatasetError(f"{self.shown(name)}: download failed {ATTEMPTS} times "
                                       f"in a row at byte {done} of {nbytes} ({_short(e)}); "
                                       f"check the network and retry") from None
                _pause(BACKOFF_S * 2 ** failures, deadline, self.shown(name), done, e)

    async def _receive(self, name: str, options: dict, deadline: Deadline, offset: int,
                       most: int, sink: Callable[[bytes], None]) -> None:
        """GET name with options; each chunk to sink. The request and every chunk must come
        by the deadline of the bytes they complete (`offset` of the read's came before);
        more than `most` bytes is an error."""
        obstore = _obstore(self.url)
        received = 0
        try:
            async with asyncio.timeout_at(deadline.due(offset)):
                result = await obstore.get_async(self.store, name, options=options)
            stream = result.stream(min_chunk_size=STREAM_CHUNK)
            while True:
                # The next chunk is STREAM_CHUNK bytes, or the rest of the object.
                async with asyncio.timeout_at(deadline.due(offset + received + STREAM_CHUNK)):
                    try:
                        chunk = await anext(stream)
                    except StopAsyncIteration:
                        return
                chunk = bytes(chunk)
                received += len(chunk)
                if received > most:
                    raise DatasetError(f"{self.shown(name)}: the server sent more than the "
                                       f"{offset + most:,} bytes asked for; the object changed, "
                                       f"or the server is broken")
                sink(chunk)
        except TimeoutError:
            raise deadline.missed(self.shown(name), offset + received) from None
        except DatasetError:
            raise
        except Exception as e:  # obstore raises its own classes; mapped by kind, never shown
            raise _as_dataset_error(e, join(self.url, name)) from None

    def _in_fresh_process(self, deadline: Deadline, *args: str, fd: int | None = None) -> str:
        """`python -m turbotrain.datasets.remote.object_store URL ARGS...`: obstore's runtime
        does not survive fork (its threads are gone: every call would hang), so a forked
        DataLoader worker of a process that used it downloads through a new process. The child
        writes into our descriptor (never reopening a cache file by name) and keeps the
        deadline itself; ours is a backstop."""
        extra = [str(fd)] if fd is not None else []
        try:
            done = subprocess.run([sys.executable, "-m", __name__, self.url, *args, *extra],
                                  capture_output=True, text=True, pass_fds=() if fd is None else (fd,),
                                  timeout=max(deadline.left(), 0) + 30)
        except subprocess.TimeoutExpired:
            raise deadline.missed(self.shown(args[1]), 0) from None
        if done.returncode != 0:
            lines = done.stderr.strip().splitlines()
            raise DatasetError(lines[-1] if lines else _ended(done, self.shown(args[1])))
        return done.stdout.strip()

    def _retrying(self, name: str, deadline: Deadline, request):
        """request(), tried again after a transient error (a body cut off mid-way: obstore
        retries only failed requests), within the read's deadline."""
        for failures in range(ATTEMPTS):
            try:
                return request()
            except _Transient as e:
                if failures == ATTEMPTS - 1:
                    raise DatasetError(f"{e} (failed {ATTEMPTS} times); check the network "
                                       f"and retry") from None
                _pause(BACKOFF_S * 2 ** failures, deadline, self.shown(name), 0, e)


def _ended(done: subprocess.CompletedProcess, shown: str) -> str:
    """The line for a download process that failed without a word: its status or signal."""
    code = done.returncode
    try:
        how = f"was killed by {signal.Signals(-code).name}" if code < 0 else f"exited {code}"
    except ValueError:  # a signal number Python has no name for
        how = f"was killed by signal {-code}"
    return f"{shown}: the process reading it for this forked process {how}, saying nothing"


def _pause(pause: float, deadline: Deadline, shown: str, received: int,
           error: BaseException) -> None:
    """Sleeps `pause` seconds before the next try, unless that would end past the deadline."""
    if pause >= deadline.left():
        raise deadline.missed(shown, received, f"the last try: {_short(error)}") from None
    time.sleep(pause)


class _ThreadLoop:
    """One thread's event loop for our reads, made on first use and closed with the thread:
    asyncio.run makes and tears down a loop per call (~5 ms each on the busy 2-core box, 14
    of them to open a 4-shard split). The thread-local below holds this object, which nothing
    else refers to: when the thread ends, its locals go and this is freed at once, closing the
    loop while it is whole. A loop left to the cycle collector (it refers to itself) may lose
    its self-pipe socket first, and its close then prints "Exception ignored ... Invalid file
    descriptor: -1" with a traceback on stderr (1 run in ~20 of the remote fuzz test)."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()

    def __del__(self):
        if not self.loop.is_closed():
            self.loop.close()


_LOOPS = threading.local()


def _run(coroutine):
    """Runs a coroutine to its end from sync code: on this thread's loop, or, where this thread
    already runs an event loop (a notebook), in a thread of its own."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        held = getattr(_LOOPS, "held", None)
        if held is None or held.loop.is_closed():
            held = _LOOPS.held = _ThreadLoop()
        return held.loop.run_until_complete(coroutine)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coroutine).result()


class _Transient(DatasetError):
    """A download that stopped early: retried, then one line."""


def _obstore(url: str):
    global _RUNTIME_PID
    try:
        import obstore
    except ImportError:
        raise DatasetError(f"{shown_url(url)}: reading datasets from object storage needs "
                           f"obstore: {INSTALL}") from None
    if _RUNTIME_PID is None:
        _RUNTIME_PID = os.getpid()
    return obstore


# The process that started obstore's (tokio) runtime: not fork-safe, see _in_fresh_process.
_RUNTIME_PID: int | None = None


def runtime_started_here() -> bool:
    """Whether this process started obstore's runtime (process_end.py: it must not finalize)."""
    return _RUNTIME_PID == os.getpid()


def forked_after_use() -> bool:
    """Whether this is a forked child of a process that used obstore."""
    return _RUNTIME_PID is not None and _RUNTIME_PID != os.getpid()


def _make_store(url: str):
    _obstore(url)
    from obstore.store import from_url
    options = dict(CLIENT_OPTIONS)
    scheme = url.split("://", 1)[0].lower()
    kwargs: dict = {"client_options": options, "retry_config": RETRY}
    if scheme == "s3":
        endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
        if endpoint and endpoint.lower().startswith("http://"):
            options["allow_http"] = True  # a local MinIO / Ceph / test server
        kwargs.update(_s3_credentials())
    elif scheme == "http":
        options["allow_http"] = True
    try:
        return from_url(url, **kwargs)
    except Exception as e:
        raise DatasetError(f"{shown_url(url)}: cannot use this URL ({_short(e)})") from None


def _s3_credentials() -> dict:
    """Keys from AWS_* are obstore's own; without them, boto3's chain (profiles, ~/.aws, SSO)
    when boto3 is installed."""
    if os.environ.get("AWS_ACCESS_KEY_ID") or os.environ.get("AWS_WEB_IDENTITY_TOKEN_FILE"):
        return {}
    try:
        import boto3
        from obstore.auth.boto3 import Boto3CredentialProvider
    except ImportError:
        return {}
    session = boto3.Session()
    if session.get_credentials() is None:
        return {}
    extra = {"region": session.region_name} if session.region_name else {}
    return {"credential_provider": Boto3CredentialProvider(session), **extra}


def _as_dataset_error(e: Exception, url: str) -> DatasetError:
    shown = shown_url(url)
    kind = type(e).__name__
    text = str(e)
    if kind == "NotFoundError" or isinstance(e, FileNotFoundError) or "404 Not Found" in text:
        return DatasetError(f"{shown}: no such object (HTTP 404); check the URL, and that the "
                            f"prepared folder was uploaded there (e.g. `aws s3 sync OUT URL`)")
    if kind in ("PermissionDeniedError", "UnauthenticatedError") or re.search(
            r"\b(401|403) (Forbidden|Unauthorized)", text):
        return DatasetError(f"{shown}: access denied (HTTP 401/403); check the credentials "
                            f"(AWS_ACCESS_KEY_ID / AWS_PROFILE / ~/.aws for S3, "
                            f"GOOGLE_APPLICATION_CREDENTIALS, AZURE_STORAGE_*) and that they "
                            f"may read this bucket")
    if kind == "NotSupportedError":
        return DatasetError(f"{shown}: the server does not answer range requests "
                            f"({_short(e)}); serve the dataset from an object store or an "
                            f"HTTP server that does")
    if "missing from response" in text:  # obstore's HTTP store: no Content-Length, ...
        return DatasetError(f"{shown}: the server's answer is malformed ({_short(e)})")
    if "UnexpectedRange" in text or re.search(r"Requested \d+\.\.\d+, got", text):
        return DatasetError(f"{shown}: the server sent other bytes than the range asked for "
                            f"({_short(e)}); the object changed, or the server is broken")
    return _Transient(f"{shown}: {_short(e)}")


def _short(e: BaseException) -> str:
    """The first line of an error, without URLs' queries or anything after 'Debug source'."""
    text = str(e).split("Debug source", 1)[0].strip().splitlines() or [type(e).__name__]
    line = re.sub(r"\?\S*", "", text[0])  # a presigned query string
    return printable(line[:200])


def _main(argv: list[str]) -> int:
    """`URL size NAME` or `URL download NAME NBYTES FD` (Store._in_fresh_process)."""
    url, op, name, *rest = argv
    store = Store(url)
    try:
        if op == "size":
            print(store.size(name))
        else:
            with os.fdopen(int(rest[1]), "r+b") as f:
                store.download(name, f, int(rest[0]), lambda chunk: None)
    except DatasetError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    # The imported module's _main, not this __main__ copy's: process_end reads the runtime's
    # owner from turbotrain.datasets.remote.object_store.
    from . import object_store
    from turbotrain.process_end import run_as_process
    run_as_process(object_store._main, sys.argv[1:])
