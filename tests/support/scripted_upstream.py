"""A scripted fake pool: for what no real vLLM can be made to send.

Malformed streams, a precise fault, a stream delivered in one read: the fuzz and
record-truth suites script each response read by read (see ``ScriptedUpstream``).
Every test that uses it says why a real engine cannot produce its case.
"""

from __future__ import annotations

import json
import select
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from obs.procs import free_port

HOLD_MAX_S = 30.0  # longest a held response waits for its test
_CHUNK = {"id": "chatcmpl-f", "object": "chat.completion.chunk", "created": 0, "model": "tiny"}


def sse_frame(obj: Any) -> bytes:
    """One SSE frame as vLLM writes it: compact JSON, UTF-8."""
    text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return b"data: " + text.encode() + b"\n\n"


def chunk_frame(choice: dict[str, Any], **extra: Any) -> bytes:
    """A ``chat.completion.chunk`` frame with one choice (``extra``: more top-level fields)."""
    return sse_frame({**_CHUNK, "choices": [{"index": 0, **choice}], **extra})


def token_frame(text: str, finish_reason: str | None = None) -> bytes:
    """A chat chunk carrying ``text`` as its content delta."""
    return chunk_frame({"delta": {"content": text}, "finish_reason": finish_reason})


def usage_frame(prompt_tokens: int, completion_tokens: int) -> bytes:
    """The last chunk of a stream asked for usage: no choices, the token counts."""
    usage = {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }
    return sse_frame({**_CHUNK, "choices": [], "usage": usage})


class Script:
    """One response of the fake pool: status, content type, the body as written read by read.

    ``ending``: ``done``/``eof`` finish the chunked body; ``cut`` closes the connection
    without the final chunk. ``gap_s``: the pause between pieces; ``end_delay_s``: how long
    the pool waits after the last piece before it ends the body. ``burst``: every piece (one
    HTTP chunk each) goes out in one write, so the sidecar reads them together, as from a
    loaded vLLM API server. ``hold``: the pool ends the body only once this event is set (at
    most ``HOLD_MAX_S``), so a test decides when a request stops occupying its lane.
    """

    def __init__(
        self,
        status: int = 200,
        content_type: str = "text/event-stream",
        pieces: list[bytes] | None = None,
        ending: str = "done",
        end_delay_s: float = 0.0,
        burst: bool = False,
        gap_s: float = 0.001,
        hold: threading.Event | None = None,
    ) -> None:
        self.gap_s = gap_s
        self.hold = hold
        self.status = status
        self.end_delay_s = end_delay_s
        self.burst = burst
        self.content_type = content_type
        self.pieces = pieces or []
        self.ending = ending
        self.body = b"".join(self.pieces)

    def __repr__(self) -> str:  # huge frames shortened: the example must stay readable
        pieces = [p if len(p) <= 300 else p[:150] + b"..." + p[-50:] for p in self.pieces]
        return (
            f"Script(status={self.status}, content_type={self.content_type!r}, "
            f"ending={self.ending!r}, pieces={pieces!r})"
        )


def _hung_up_while(conn: socket.socket, hold: threading.Event) -> bool:
    """Wait until ``hold`` is set (at most ``HOLD_MAX_S``); True if the peer closed first."""
    deadline = time.monotonic() + HOLD_MAX_S
    while not hold.wait(0.005) and time.monotonic() < deadline:
        readable, _, _ = select.select([conn], [], [], 0)
        if readable and conn.recv(1, socket.MSG_PEEK) == b"":
            return True
    return False


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128  # listen backlog: the default 5 drops a burst of connects (1 s)

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # the sidecar hung up: fine
            super().handle_error(request, client_address)


class ScriptedUpstream:
    """A fake vLLM pool on 127.0.0.1 that answers each request with the script for its id.

    It exists because no real vLLM produces malformed streams. It speaks plain HTTP/1.1:
    chunked bodies, one chunk per scripted piece (flushed, so reads split where the
    script split them), and ``cut`` closes the connection without the final chunk.
    ``/metrics`` and ``/v1/models`` answer like an idle pool.
    """

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.scripts: dict[str, Script] = {}
        self.received: list[tuple[str, bytes]] = []  # (path, body) of every POST, in order
        self.gets: list[str] = []  # the path of every GET, in order
        self.cut_off: set[str] = set()  # request ids whose answer the sidecar hung up on
        self.traceparents: dict[str, str] = {}  # request id -> the traceparent it was sent
        self.models = ["tiny"]  # the ids /v1/models lists (a test may change them)
        upstream = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # TCP_NODELAY, as vLLM's server (uvicorn) sets: with Nagle on, a piece written
            # while the previous one is unacknowledged waits for the sidecar's delayed ACK
            # (40 ms on Linux) on every reused connection.
            disable_nagle_algorithm = True

            def do_GET(self) -> None:
                upstream.gets.append(self.path)
                data = [{"id": m, "object": "model"} for m in upstream.models]
                body = json.dumps({"object": "list", "data": data}, separators=(",", ":")).encode()
                if self.path == "/metrics":
                    body = b""
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                n = int(self.headers.get("content-length") or 0)
                upstream.received.append((self.path, self.rfile.read(n)))
                rid = self.headers.get("x-request-id", "")
                upstream.traceparents[rid] = self.headers.get("traceparent", "")
                script = upstream.scripts.get(rid, Script())
                self.send_response(script.status)
                self.send_header("content-type", script.content_type)
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                self.wfile.flush()
                chunks = [b"%x\r\n%s\r\n" % (len(p), p) for p in script.pieces if p]
                try:
                    for chunk in [b"".join(chunks)] if script.burst else chunks:
                        self.wfile.write(chunk)
                        self.wfile.flush()
                        time.sleep(script.gap_s)  # let the sidecar read each piece on its own
                    time.sleep(script.end_delay_s)
                    if script.hold is not None and _hung_up_while(self.connection, script.hold):
                        raise ConnectionResetError("the sidecar closed the connection")
                    if script.ending == "cut":
                        self.close_connection = True
                        return
                    self.wfile.write(b"0\r\n\r\n")
                    self.wfile.flush()
                except OSError:
                    upstream.cut_off.add(rid)
                    self.close_connection = True

            def log_message(self, *args: object) -> None:
                return None

        self._server = _QuietServer(("127.0.0.1", self.port), Handler)
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        # It looks for shutdown every 10 ms (the default 0.5 s was each module's teardown).
        self._server.serve_forever(poll_interval=0.01)

    def __enter__(self) -> ScriptedUpstream:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
