"""A client that resets its connection as its stream starts (issue 25, item 7).

A real sidecar process; the pool is ``ScriptedUpstream`` streaming twenty frames a few ms
apart, because a real vLLM cannot be made to start every stream at the same instant
after the client's reset. The client is a raw socket closed with ``SO_LINGER`` 0 (a TCP
reset), right after sending its request or after the first bytes of the answer.
"""

from __future__ import annotations

import socket
import struct
import time
from collections import Counter
from pathlib import Path

import orjson

from obs import conventions as c
from tests.conftest import SidecarFactory
from tests.support.rawhttp import connect
from tests.support.scripted_upstream import Script, ScriptedUpstream

FRAME = (
    b'data: {"id":"c","object":"chat.completion.chunk","model":"tiny",'
    b'"choices":[{"index":0,"delta":{"content":"x"}}]}\n\n'
)
RESETS = 60


def test_a_reset_as_the_stream_starts_is_a_client_disconnect_never_internal(
    sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """Every reset is recorded ``client_disconnect``, none ``internal``, no traceback logged."""
    body = orjson.dumps(
        {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "stream": True}
    )
    with ScriptedUpstream() as pool:
        sc = sidecar(pool.url, traces=False)
        for i in range(RESETS):
            rid = f"reset-{i}"
            pool.scripts[rid] = Script(pieces=[FRAME] * 20 + [b"data: [DONE]\n\n"], gap_s=0.002)
            s = connect(sc.port)
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: "
                b"application/json\r\nx-request-id: %b\r\ncontent-length: %d\r\n\r\n%b"
                % (rid.encode(), len(body), body)
            )
            if i % 2:
                s.recv(10)  # the stream has started
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            s.close()
        events = sc.wait_events(RESETS, timeout_s=30)
        time.sleep(0.3)  # a traceback is logged before its event is written
        log = sc.log_tail(1 << 20)
    outcomes = Counter((e["status"], e["error_class"]) for e in events)
    assert outcomes == {(c.DISCONNECTED, "client_disconnect"): RESETS}, outcomes
    assert "Traceback" not in log
