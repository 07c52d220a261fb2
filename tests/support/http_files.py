"""A local HTTP server of a folder's files (127.0.0.1 only), for the tests that read datasets over HTTP.

GET and HEAD answer the files under its root (404 outside it or for a missing file); every raw request path
is recorded in `asked`, and a path ending with one of `failing` answers 500.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import threading
import time
from typing import Iterator
from urllib.parse import unquote


class _Files(http.server.BaseHTTPRequestHandler):
    def _file(self):
        self.server.asked.append(self.path)
        rel = unquote(self.path.split("?", 1)[0]).lstrip("/")
        full = os.path.join(self.server.root, rel)
        if any(rel.endswith(f) for f in self.server.failing):
            self.send_error(500)
            return None
        if ".." in rel.split("/") or not os.path.isfile(full):
            self.send_error(404)
            return None
        with open(full, "rb") as f:
            body = f.read()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        return body

    def do_GET(self):  # noqa: N802
        body = self._file()
        if body is not None:
            self.wfile.write(body)

    def do_HEAD(self):  # noqa: N802
        self._file()

    def log_message(self, *args):
        pass


@contextlib.contextmanager
def serve(root: str, handler: type = _Files) -> Iterator[tuple[str, list[str], set[str]]]:
    """Serve `root` (made if missing): (its URL, the request paths seen, the path endings that answer 500).
    `handler`: a subclass of `_Files` that answers some paths otherwise (a server that misbehaves)."""
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    srv.daemon_threads, srv.root, srv.asked, srv.failing = True, str(root), [], set()
    os.makedirs(srv.root, exist_ok=True)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}", srv.asked, srv.failing
    finally:
        srv.shutdown()
        srv.server_close()


class _Slow(_Files):
    def _file(self):
        if self.command == "GET" and ".arrow" in self.path:
            time.sleep(0.3)
        return super()._file()
