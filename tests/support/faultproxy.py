"""A real HTTP proxy in front of the tests' S3 server that answers chosen requests with an error status (S3's 500
InternalError, 503 SlowDown) and forwards the rest: how a store under load answers now and then. moto's server has
no fault injection of its own."""

from __future__ import annotations

import http.client
import http.server
import socketserver
import threading
from contextlib import contextmanager
from typing import Iterator


class FaultProxy:
    def __init__(self, upstream: str):
        self.upstream = upstream.split("//", 1)[1]
        self.lock = threading.Lock()
        self.failing = 0  # how many more matching requests get the error
        self.method, self.status, self.code = "PUT", 500, "InternalError"
        self.prefix = "/"  # only requests for paths under it fail (a test's own bucket: "/BUCKET/")
        self.seen: list[tuple[str, str, int]] = []  # (method, path, status answered)
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:
                pass

            def handle_any(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                with proxy.lock:
                    fail = self.command == proxy.method and self.path.startswith(proxy.prefix) and proxy.failing > 0
                    if fail:
                        proxy.failing -= 1
                if fail:
                    payload = (f"<?xml version='1.0' encoding='UTF-8'?><Error><Code>{proxy.code}</Code><Message>"
                               f"injected by the test's proxy</Message></Error>").encode()
                    self.answer(proxy.status, [("Content-Type", "application/xml")], payload)
                    return
                upstream = http.client.HTTPConnection(proxy.upstream, timeout=30)
                try:
                    headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
                    upstream.request(self.command, self.path, body=body, headers=headers)
                    response = upstream.getresponse()
                    data = response.read()
                    kept = [(k, v) for k, v in response.getheaders()  # a HEAD keeps the object's length
                            if k.lower() not in ("transfer-encoding", "connection")
                            and (k.lower() != "content-length" or self.command == "HEAD")]
                    self.answer(response.status, kept, data)
                finally:
                    upstream.close()

            def answer(self, status: int, headers: list, payload: bytes) -> None:
                proxy.seen.append((self.command, self.path, status))
                self.send_response(status)
                for key, value in headers:
                    self.send_header(key, value)
                if not any(key.lower() == "content-length" for key, _ in headers):
                    self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(payload)

            do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = handle_any

        class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
            daemon_threads = True

        self.server = Server(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def fail_next(self, count: int, method: str = "PUT", status: int = 500, code: str = "InternalError",
                  prefix: str = "/") -> None:
        with self.lock:
            self.failing, self.method, self.status, self.code, self.prefix = count, method, status, code, prefix
        self.seen.clear()


@contextmanager
def fault_proxy(upstream: str) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream)
    try:
        yield proxy
    finally:
        proxy.server.shutdown()
        proxy.server.server_close()
