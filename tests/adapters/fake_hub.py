"""A local stand-in for the Hugging Face Hub's API, for resolve tests: missing, gated and bad-revision repos."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest


class FakeHub(BaseHTTPRequestHandler):
    """Answers /api/models/<org>/<name>/revision/<rev> like the Hub does for missing / gated repos."""

    def do_GET(self):  # noqa: N802 - http.server API
        if "/gated/" in self.path or self.path.endswith("/gated"):
            status, code, msg = 403, "GatedRepo", "Access to model org/gated is restricted."
        elif "/revision/nobranch" in self.path:
            status, code, msg = 404, "RevisionNotFound", "Invalid rev id: nobranch"
        else:
            status, code, msg = 401, "RepoNotFound", "Repository not found"
        body = f'{{"error": "{msg}"}}'.encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", msg)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@contextmanager
def serving(monkeypatch: pytest.MonkeyPatch, tmp_path) -> Iterator[None]:
    """The Hub client pointed at FakeHub on 127.0.0.1 with an empty cache, for the duration."""
    import huggingface_hub.constants as hc

    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hc, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
