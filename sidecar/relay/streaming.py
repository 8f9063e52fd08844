"""Relaying one response from the pool to the client: an SSE stream, timing each output
frame, or a whole body.

A stream is relayed inside the pool socket's callback (``StreamSink.on_body``,
called by ``obs.sidecar.pools.upstream`` with the de-chunked body of each read): one
``perf_counter_ns``, the frame split, ``classify``, a list append for the
inter-token gap, and a write straight to the client's transport. No task
switch and no ASGI message per token; the relay's coroutine awaits once, for
the end of the body, then sends the last piece through ASGI so the server
ends the response as usual.

Slow readers: what the client has not taken yet waits in its connection's
bounded write buffer (see obs.sidecar.server.client). Under the lane's ``wait``
policy, a full buffer pauses reading from the pool (its socket backs up, as
nginx does) until the client catches up (``ClientConn.writable()`` is done); under
``abort`` the stream ends.
There is one hot path: the relay runs on the sidecar's own server, whose client
connection it writes to (``Relay._handle`` refuses a request that comes without one).
"""

from __future__ import annotations

import asyncio
import time

from obs.config import SlowClient
from obs.phases import ms
from obs.sidecar import endings as end
from obs.sidecar.endings import Ending
from obs.sidecar.outcomes import RelayError, UpstreamError
from obs.sidecar.pools.upstream import Response
from obs.sidecar.relay.deadline import Deadline
from obs.sidecar.relay.payloads import (
    ENDED_STREAMS,
    apply_usage,
    error_message,
    read_completion,
)
from obs.sidecar.relay.request import MAX_GAPS, Request
from obs.sidecar.relay.respond import BODY as _BODY
from obs.sidecar.relay.respond import fail, send_head, start_head
from obs.sidecar.relay.sse import FrameSplitter, StreamState, UsageStripper, classify
from obs.sidecar.server.client import ClientConn
from obs.sidecar.types import Send


class StreamSink:
    """The per-piece work of one streamed response, run in the pool socket's callback."""

    __slots__ = (
        "abort_at", "aborted", "blocked", "burst", "conn", "deadline", "ended", "error",
        "first_read", "last", "last_out", "limit", "paused_at", "read_chunks", "read_tokens",
        "req", "resp", "splitter", "state", "stripper", "waiting",
    )  # fmt: skip

    def __init__(
        self,
        req: Request,
        resp: Response,
        inject: bool,
        conn: ClientConn,
        slow: SlowClient,
        deadline: Deadline,
    ) -> None:
        self.req, self.resp, self.conn, self.deadline = req, resp, conn, deadline
        self.limit = slow.buffer_bytes
        self.abort_at = self.limit if slow.policy == "abort" else 0
        self.splitter = FrameSplitter()
        self.state = StreamState()
        self.stripper = UsageStripper() if inject else None
        self.last_out = 0  # perf_counter_ns of the read that brought the last output frame
        self.read_chunks = 0  # output frames in that read
        self.read_tokens = 0  # the tokens they carried
        self.first_read = 0  # tokens in the first read that carried output
        self.burst = 0  # the most output frames that arrived in one read
        self.blocked = 0  # ns the relay waited on the client
        self.paused_at = 0  # the pool's connection is paused for a slow client since then
        self.waiting: asyncio.Future[None] | None = None  # until the client takes more
        self.aborted = False
        self.ended = False
        self.error: UpstreamError | None = None
        self.last = b""  # the body's last piece, sent with the response's end (relay_stream)

    def on_body(self, data: bytes) -> None:
        now = self.resp.read_ns or time.perf_counter_ns()
        req, state = self.req, self.state
        if self.last_out:
            self.deadline.last_ns = now
        frames = self.splitter.feed(data)
        if not frames:
            return
        if req.capture_frames is not None:
            req.capture_frames.extend(frames)
        stripper = self.stripper
        if req.json_answer is not None:
            for frame in frames:
                req.json_answer.feed_frame(frame)
        out = frames if stripper is None else []  # without a stripper every frame goes on
        for frame in frames:
            tokens, is_usage = classify(frame, state)
            if tokens:
                self._output_at(now, tokens)
            if stripper is not None:
                out.extend(stripper.process(frame, is_usage, state.fingerprint))
        if not out or req.disconnected or self.aborted:
            return
        payload = out[0] if len(out) == 1 else b"".join(out)
        conn = self.conn
        if self.abort_at and conn.buffered() > self.abort_at:
            self.aborted = True
            self.resp.close()  # vLLM aborts the request when its connection closes
            return
        if state.done and self.resp.ending:  # the pool's last piece: one write with the end
            self.last = payload
            req.delivered = True
            conn.body_in_hand()  # and with the head, if it still waits (a whole short answer)
            return
        if self.last_out and not req.clock.first_sent:  # handed over as the write starts
            req.clock.first_sent = time.perf_counter_ns()
        conn.write_body(payload)
        if state.done:  # the [DONE] frame is the client's: the stream was delivered whole
            req.delivered = True
        if conn.paused and not self.paused_at:  # the client is behind: stop reading the pool
            self.paused_at = time.perf_counter_ns()
            self.deadline.sending = True
            self.resp.pause_reading()
            self.waiting = conn.writable()
            self.waiting.add_done_callback(self._writable)

    def _output_at(self, now: int, tokens: int) -> None:
        """An output frame carrying ``tokens`` arrived in the read at ``now``.

        Frames of one read arrived together: the gaps between them were not seen, so a read
        gives one inter-token gap (from the previous read), not one per frame, and a stream
        that arrived in a single read has no cadence at all (see ``obs.record``).
        """
        last, req = self.last_out, self.req
        if now == last:
            self.read_chunks += 1
            self.read_tokens += tokens
        else:
            if last:
                if len(req.itl) < MAX_GAPS:
                    req.itl.append(now - last)
            else:
                req.clock.first_up = now
                self.deadline.first_output(now)
            self.last_out = now
            self.read_chunks = 1
            self.read_tokens = tokens
        if self.read_chunks > self.burst:
            self.burst = self.read_chunks
        if not req.itl:
            self.first_read = self.read_tokens

    def _writable(self, _: asyncio.Future[None]) -> None:
        self.waiting = None
        if not self.conn.left:  # else the stream's end counts the wait (relay_stream)
            self.resumed()

    def stop_waiting(self) -> None:
        if self.waiting is not None:
            self.waiting.remove_done_callback(self._writable)
            self.waiting = None

    def resumed(self) -> None:
        if not self.paused_at:
            return
        now = time.perf_counter_ns()
        self.blocked += now - self.paused_at
        self.paused_at = 0
        self.deadline.sending = False
        if self.last_out:
            self.deadline.last_ns = now
        self.resp.resume_reading()

    def on_end(self, exc: UpstreamError | None) -> None:
        self.ended = True
        self.error = exc


# Response headers not copied from the pool (hop-by-hop, or set by our server); a stream's
# length is the relay's (usage stripped, error frames), a whole body's as it came.
_SKIP_HEADERS = frozenset({b"connection", b"keep-alive", b"transfer-encoding", b"date", b"server"})
_SKIP_STREAM_HEADERS = _SKIP_HEADERS | {b"content-length"}


def is_stream(resp: Response) -> bool:
    """The pool answered with a stream (else the body is relayed whole: ``relay_whole``)."""
    return resp.status < 400 and resp.content_type.startswith("text/event-stream")


def response_headers(req: Request, resp: Response) -> list[tuple[bytes, bytes]]:
    """The client's response headers: the pool's, less hop-by-hop ones, and the tenant's
    ``x-ratelimit-*`` (docs/flow.md)."""
    skip = _SKIP_STREAM_HEADERS if is_stream(resp) else _SKIP_HEADERS
    out = [kv for kv in resp.raw_headers if kv[0] not in skip]  # names lower-case
    if req.charge is not None:
        out += req.charge.rate_headers
    return out


def stream_at_head(
    req: Request, inject: bool, slow: SlowClient, deadline: Deadline, resp: Response
) -> None:
    """The pool's head is in (``Response.on_head``, in its socket's callback): a 2xx stream
    starts to the client here, and the frames that came with the head (vLLM's first one)
    go out in this same callback, not once the relay's task has woken (c1's TTFT). Anything
    else (an error, a whole body, a 503 to fail over) is the relay's task's to answer."""
    conn = req.conn
    if not 200 <= resp.status < 300 or not is_stream(resp) or conn is None or req.disconnected:
        return
    conn.bound(slow.buffer_bytes, wait=slow.policy != "abort")
    if start_head(req, conn, resp.status, response_headers(req, resp)):
        req.response = resp
        resp.attach(StreamSink(req, resp, inject, conn, slow, deadline))


async def respond(
    req: Request, resp: Response, inject: bool, send: Send, slow: SlowClient, dl: Deadline
) -> None:
    """Relay the pool's answer to the client: a stream (started at its head already, or
    now), or a whole body."""
    if resp.sink is None:  # not started as its head came (stream_at_head)
        req.event.http_status = resp.status
        out_headers = response_headers(req, resp)
        if not is_stream(resp):
            await relay_whole(req, resp, out_headers, send)  # bounded by dl: closed, it fails
            return
        await send_head(req, send, resp.status, out_headers)
    await relay_stream(req, resp, inject, send, slow, dl)


async def relay_stream(
    req: Request,
    resp: Response,
    inject: bool,
    send: Send,
    slow: SlowClient,
    deadline: Deadline,
) -> None:
    """Relay a stream whose head the client has (``send_head``, or ``stream_at_head`` with
    its sink attached) to its end."""
    ev, clock, conn = req.event, req.clock, req.conn
    assert conn is not None  # Relay._handle refuses a request without its client connection
    sink = resp.sink
    if not isinstance(sink, StreamSink):
        conn.bound(slow.buffer_bytes, wait=slow.policy != "abort")
        sink = StreamSink(req, resp, inject, conn, slow, deadline)
    state = sink.state
    try:
        await resp.stream(sink)
    finally:
        sink.stop_waiting()
    clock.last_up = sink.last_out
    req.answer_id = state.response_id
    req.first_read_chunks = sink.first_read
    ev.burst_chunks = sink.burst or None
    sink.resumed()  # a wait on the client still on when the stream ended counts as blocked
    # The stream ends with an error frame: the client fell too far behind (the lane's
    # ``abort`` policy), or the pool failed (a deadline's verdict among its failures).
    ended = None
    if sink.aborted:
        ended = Ending(end.SLOW_READER, limit=sink.limit)
    elif sink.error is not None and not req.disconnected:
        ended = Ending(end.FAILED, "streaming", cause=sink.error)
    if ended is not None:
        await end_stream(req, state, send, ended)
        ev.stream_blocked_ms = ms(sink.blocked)
        return
    req.release()  # the pool is done with this request, whatever the client still has to read
    if req.disconnected:
        # A client that leaves on the pool's error frame (the openai SDK raises on it and
        # closes) left because of the pool's answer: that answer is the outcome.
        if state.error is not None:
            frame = Ending(end.POOL_FRAME, frame=state.error)
            req.settle(frame, clock.current_phase(upstream_done=True))
        ev.stream_blocked_ms = ms(sink.blocked)
        apply_usage(ev, state)
        return
    stripper, splitter = sink.stripper, sink.splitter
    tail = [sink.last] if sink.last else []
    if stripper:
        tail += stripper.flush()
    if splitter.pending and state.done:  # bytes after [DONE]: the pool's, relayed as they are
        tail.append(splitter.pending)
    if not state.done and state.error is None and ev.route in ENDED_STREAMS:
        tail.append(stream_failed(req, state, Ending(end.CUT)).sse_frame())
    elif state.error is not None:  # the pool's error frame: a 4xx code is the client's mistake
        frame = Ending(end.POOL_FRAME, frame=state.error)
        req.settle(frame, clock.current_phase(upstream_done=True))
    elif req.json_answer is not None:  # the whole answer came: judge it (a cut one is not)
        ev.json_valid = req.json_answer.verdict()
    perf = time.perf_counter_ns
    t0 = perf()
    await send({"type": _BODY, "body": b"".join(tail), "more_body": False})
    req.done = True  # only now: a shutdown cut during the send still ends the body cleanly
    t1 = perf()
    if sink.last and sink.last_out and not clock.first_sent:  # it held the first token
        clock.first_sent = t0
    deadline.cancel()  # the pool is done: its deadlines do not run while the client reads
    await _until_acknowledged(req, conn, slow.record_wait_s)  # the record's end: conn.acked_ns
    ev.stream_blocked_ms = ms(sink.blocked + t1 - t0)
    apply_usage(ev, state)


async def _until_acknowledged(req: Request, conn: ClientConn, wait_s: float) -> None:
    """The stream phase ends when the client's side has acknowledged the last byte, whatever
    the connection kind (the response lingers: obs.sidecar.server.client), or after
    ``wait_s``: the event then says how many bytes it had not (``client_unread_bytes``). A
    client that resets the connection with bytes unacknowledged left before the end."""
    unread = await conn.drained(wait_s)
    if unread:
        req.event.client_unread_bytes = unread
        if conn.left:
            req.disconnected = True
            req.settle(Ending(end.LEFT), "stream")


async def relay_whole(
    req: Request,
    resp: Response,
    out_headers: list[tuple[bytes, bytes]],
    send: Send,
) -> None:
    """A response that is not a stream (an error status, a non-streamed answer), sent whole;
    the first-token deadline that bounds it fails it with its verdict."""
    ev, clock = req.event, req.clock
    try:  # a whole answer is its first token: the first-token deadline bounds it
        data = await resp.read()
    except UpstreamError as err:
        if req.disconnected:
            return
        raise end.failed(err, "reading the response") from err  # a deadline's verdict too
    if resp.status < 400:  # an error body is no first token: no TTFT, TPOT or output for it
        clock.first_up = clock.last_up = time.perf_counter_ns()
    if req.capture_frames is not None:
        req.capture_whole = data
    if resp.status >= 400:  # 503: vLLM's own admission (--max-num-queued-reqs/-tokens)
        req.settle(Ending(end.POOL_STATUS, error_message(data), status=resp.status), None)
    elif ev.route in ENDED_STREAMS:  # a completion, a response or a message
        req.answer_id = read_completion(ev, data)
        if req.json_answer is not None:
            req.json_answer.feed_body(data)
            ev.json_valid = req.json_answer.verdict()
    await send_head(req, send, resp.status, out_headers)
    await send({"type": _BODY, "body": data, "more_body": False})
    req.done = True  # the record ends now (Relay._finish)
    if clock.first_up:
        clock.first_sent = time.perf_counter_ns()


def stream_failed(req: Request, state: StreamState, ended: Ending) -> RelayError:
    """The stream ended as ``ended`` says (a stalled client's 408 is its own): settled, so
    the event says so, with the tokens that came; the settled outcome is returned."""
    settled = req.settle(ended, req.clock.current_phase())
    apply_usage(req.event, state)
    return settled


async def end_stream(req: Request, state: StreamState, send: Send, ended: Ending) -> None:
    """End a started stream as ``ended`` says, with its outcome's frame (an idle timeout's
    504, a stalled client's 408, a broken pool's 502), as the event records it: through the
    relay's one answer path (``respond.fail``); the record ends now (``Relay._finish``)."""
    await fail(req, send, stream_failed(req, state, ended), None)
