"""Engine spans across ``--workers``: each span reaches the worker that relayed its request.

vLLM posts its request spans to the sidecar's port, and the kernel hands each connection to
any worker; the request's record waits for its span in the worker that relayed it
(``obs.sidecar.record.engine_join``). Each worker makes its span ids so that the id names
it (``obs.tracecontext.new_span_id``: the id modulo the worker count is the worker's index),
and the engine makes that id its request span's parent. So the worker that receives a span
reads the owner from the parent id, keeps its own, and posts the others' to their owners'
private loopback ports (the ones their metrics are served on:
``obs.sidecar.server.worker_metrics``), where they join as if they had arrived there. A
hand-off that fails (a worker restarting) loses that span: its request is written after
the join wait without the engine view (``engine_view: absent``), as for a span that never
came.

The private ports are on loopback, where any local process can reach them: a hand-off
carries the supervisor's per-start secret (``headers``: ``WorkerSlot.handoff_headers``, made
with ``secrets`` at each start and never written anywhere), and the receiving server
refuses a post without it (403), so no other process can forge a worker's spans.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict

import aiohttp
import orjson
import structlog

from obs.sidecar.record.otlp import ReceivedSpan
from obs.tracecontext import owner_of

log = structlog.get_logger("vllm_obs.span_handoff")

PATH = "/engine-spans"
TIMEOUT_S = 2.0


def encode(spans: Sequence[ReceivedSpan]) -> bytes:
    return orjson.dumps([asdict(s) for s in spans], default=str)


def decode(body: bytes) -> list[ReceivedSpan]:
    return [ReceivedSpan(**d) for d in orjson.loads(body)]


class SpanHandoff:
    """Splits received spans by owner: returns this worker's, posts the rest to theirs."""

    def __init__(
        self,
        index: int,
        ports: Sequence[int],
        session: Callable[[], aiohttp.ClientSession],
        on_span: Callable[[ReceivedSpan], None],
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.index = index
        self.headers = dict(headers or {})  # the secret siblings check
        self.ports = tuple(ports)
        self.session = session
        self.on_span = on_span
        self.loop: asyncio.AbstractEventLoop | None = None
        self.lost = 0

    async def __call__(self, spans: list[ReceivedSpan]) -> list[ReceivedSpan]:
        mine: list[ReceivedSpan] = []
        theirs: dict[int, list[ReceivedSpan]] = {}
        for s in spans:
            owner = owner_of(s.parent_span_id, len(self.ports))
            if owner == self.index:
                mine.append(s)
            else:
                theirs.setdefault(owner, []).append(s)
        if theirs:
            await asyncio.gather(*(self._post(i, batch) for i, batch in theirs.items()))
        return mine

    async def _post(self, owner: int, spans: list[ReceivedSpan]) -> None:
        url = f"http://127.0.0.1:{self.ports[owner]}{PATH}"
        try:
            timeout = aiohttp.ClientTimeout(total=TIMEOUT_S)
            post = self.session().post(
                url, data=encode(spans), headers=self.headers, timeout=timeout
            )
            async with post as resp:
                if resp.status != 204:
                    raise aiohttp.ClientResponseError(
                        resp.request_info, (), status=resp.status, message="refused"
                    )
        except (aiohttp.ClientError, OSError, TimeoutError) as err:
            self.lost += len(spans)
            log.warning(
                "engine_span_handoff_failed", worker=owner, spans=len(spans), error=str(err)
            )

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The worker's event loop, where handed-over spans join (set when the app starts)."""
        self.loop = loop

    def receive(self, body: bytes) -> bool:
        """Spans a sibling handed over (called in the private server's thread); False when
        they cannot be read or the worker has no loop yet."""
        try:
            spans = decode(body)
        except (ValueError, TypeError):
            return False
        if self.loop is None:
            return False
        self.loop.call_soon_threadsafe(self._join, spans)
        return True

    def _join(self, spans: list[ReceivedSpan]) -> None:
        for s in spans:
            self.on_span(s)
