"""A misbehaving HTTP server for the remote-read tests, on 127.0.0.1 only, started and stopped
by the tests themselves (`with serve(folder) as server:`).

It serves the files of a folder as an object store does over plain HTTP (what obstore's
http:// store reads: HEAD with Content-Length, ETag and Last-Modified; GET with a byte Range,
answered 206), and `server.behave[name] = MODE` makes it misbehave for one object:

* "ok": the right bytes;
* "endless": a 206 that says its body is 1 TiB (Content-Length) and sends zeros until the client
  hangs up (the old reader buffered it: 4 GB, then an allocator abort);
* "chunked": a 206 whose chunked body never ends;
* "long": the bytes asked for and then the rest of the object, as if the range had no end;
* "short": Content-Length says the full range, the body stops half-way, the connection closes;
* "slow": one byte every `server.drip_s` seconds (0.2 by default), forever;
* "silent": headers never come;
* "ignore-range": 200 and the whole object, whatever range was asked for;
* a callable `f(data: bytes, start: int, end: int) -> bytes`: serves f's bytes as the range
  (what a fuzzer uses to lie about content).

A mode ending in ":download" ("slow:download") applies only to a download of the whole
object (no Range, or an open-ended one), so dataset.json and the shard headers still come.
`server.requests` lists (method, object name, Range header) of every request.
"""
from __future__ import annotations

import contextlib
import email.utils
import http.server
import threading
import time
from pathlib import Path


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: "_Server"

    def log_message(self, *args) -> None:  # quiet
        pass

    def _object(self) -> tuple[str, bytes | None]:
        name = self.path.split("?", 1)[0].rsplit("/", 1)[-1]
        path = self.server.root / name
        return name, (path.read_bytes() if path.is_file() else None)

    def _common_headers(self, length: int | None) -> None:
        self.send_header("ETag", '"turbotrain-test"')
        self.send_header("Last-Modified", email.utils.formatdate(0, usegmt=True))
        if length is not None:
            self.send_header("Content-Length", str(length))

    def do_HEAD(self) -> None:
        name, data = self._object()
        self.server.requests.append(("HEAD", name, None))
        if data is None:
            self.send_response(404)
            self._common_headers(0)
            self.end_headers()
            return
        self.send_response(200)
        self._common_headers(len(data))
        self.end_headers()

    def do_GET(self) -> None:
        name, data = self._object()
        asked = self.headers.get("Range")
        self.server.requests.append(("GET", name, asked))
        if data is None:
            self.send_response(404)
            self._common_headers(0)
            self.end_headers()
            return
        start, end = 0, len(data)
        if asked and asked.startswith("bytes="):
            first, _, last = asked[len("bytes="):].partition("-")
            start = int(first)
            end = min(int(last) + 1, len(data)) if last else len(data)
        mode = self.server.behave.get(name, "ok")
        if isinstance(mode, str) and mode.endswith(":download"):
            mode = mode.split(":")[0] if not asked or asked.endswith("-") else "ok"
        try:
            self._respond(mode, data, start, end, ranged=bool(asked))
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client gave up: what a bounded reader does

    def _respond(self, mode, data: bytes, start: int, end: int, ranged: bool) -> None:
        stop = self.server.stopping
        if mode == "silent":
            while not stop.wait(0.1):
                pass
            return
        if mode == "ignore-range":
            start, end, ranged = 0, len(data), False
        if mode == "long":
            end = len(data)
        body = mode(data, start, end) if callable(mode) else data[start:end]
        self.send_response(206 if ranged else 200)
        if ranged:
            self.send_header("Content-Range", f"bytes {start}-{max(start, end - 1)}/{len(data)}")
        if mode == "chunked":
            self.send_header("Transfer-Encoding", "chunked")
            self._common_headers(None)
            self.end_headers()
            while not stop.is_set():
                self.wfile.write(b"10000\r\n" + b"\0" * 65536 + b"\r\n")
            return
        if mode == "endless":
            self._common_headers(1 << 40)
            self.end_headers()
            self.wfile.write(body)
            while not stop.is_set():
                self.wfile.write(b"\0" * 65536)
            return
        self._common_headers(len(body))
        self.end_headers()
        if mode == "short":
            self.wfile.write(body[:len(body) // 2])
            self.close_connection = True
        elif mode == "slow":
            for i in range(len(body)):
                if stop.wait(self.server.drip_s):
                    return
                self.wfile.write(body[i:i + 1])
                self.wfile.flush()
        else:
            self.wfile.write(body)


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, root: Path):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.root = Path(root)
        self.behave: dict = {}
        self.requests: list = []
        self.drip_s = 0.2
        self.stopping = threading.Event()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/ds"


@contextlib.contextmanager
def serve(root: Path):
    """The server for folder root, running in a thread until the block ends."""
    server = _Server(root)
    thread = threading.Thread(target=server.serve_forever, daemon=True,
                              name="turbotrain-test-http")
    thread.start()
    try:
        yield server
    finally:
        server.stopping.set()
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
        time.sleep(0.05)  # let handler threads see `stopping` and return
