"""Relaying one response from the pool to the client: an SSE stream, timing each output
frame, or a whole body.

Hot path per upstream read: one ``perf_counter_ns``, frame split, one orjson
parse per frame, a list append for the inter-token gap, and the ``send``.
Slow readers are absorbed by the client connection's bounded write buffer
(see obs.sidecar.client): the relay keeps reading at the pool's pace.
"""

from __future__ import annotations

import time

import aiohttp

from obs import conventions as c
from obs.config import SlowClient
from obs.phases import ms
from obs.sidecar import errors as e
from obs.sidecar.deadline import Deadline
from obs.sidecar.payloads import (
    GENERATE_ROUTES,
    apply_usage,
    error_message,
    read_completion,
    upstream_error,
)
from obs.sidecar.request import Request
from obs.sidecar.sse import FrameSplitter, StreamState, UsageStripper, classify
from obs.sidecar.types import Send

_BODY = "http.response.body"


async def relay_stream(
    req: Request,
    resp: aiohttp.ClientResponse,
    inject: bool,
    send: Send,
    slow: SlowClient,
    deadline: Deadline,
    drain_timeout_s: float,
) -> None:
    ev, clock, itl, conn = req.event, req.clock, req.itl, req.conn
    limit = slow.buffer_bytes
    abort_at = limit if conn is not None and slow.policy == "abort" else 0
    if conn is not None:
        conn.bound(limit, wait=not abort_at)
    splitter = FrameSplitter()
    state = StreamState()
    stripper = UsageStripper() if inject else None
    perf = time.perf_counter_ns
    capture = req.capture_frames
    last_out = 0
    blocked = 0
    try:
        async for data in resp.content.iter_any():
            now = perf()
            if last_out:
                deadline.last_ns = now
            frames = splitter.feed(data)
            if not frames:
                continue
            if capture is not None:
                capture.extend(frames)
            out: list[bytes] = []
            for frame in frames:
                has_output, is_usage = classify(frame, state)
                if has_output:
                    if last_out:
                        itl.append(now - last_out)
                    else:
                        clock.first_up = now
                        deadline.first_output(now)
                    last_out = now
                if stripper is None:
                    out.append(frame)
                else:
                    out.extend(stripper.process(frame, is_usage, state.fingerprint))
            if out:
                if abort_at and conn is not None and conn.buffered() > abort_at:
                    clock.last_up = last_out
                    await _abort_slow_reader(req, resp, state, send, limit)
                    ev.stream_blocked_ms = ms(blocked)
                    return
                t0 = perf()
                deadline.sending = True
                await send({"type": _BODY, "body": b"".join(out), "more_body": True})
                deadline.sending = False
                t1 = perf()
                if last_out:
                    deadline.last_ns = t1
                blocked += t1 - t0
                if last_out and not clock.first_sent:
                    clock.first_sent = t1
            if req.disconnected:
                break
    except (aiohttp.ClientError, TimeoutError) as err:
        if not req.disconnected:
            clock.last_up = last_out
            stream_failed(req, state, deadline.expired or upstream_error(err, "streaming"))
            await end_stream_with_error(req, send)
            ev.stream_blocked_ms = ms(blocked)
            return
    clock.last_up = last_out
    req.release()  # the pool is done with this request, whatever the client still has to read
    if req.disconnected:
        ev.stream_blocked_ms = ms(blocked)
        apply_usage(ev, state)
        return
    tail = stripper.flush() if stripper else []
    if splitter.pending and state.done:  # bytes after [DONE]: the pool's, relayed as they are
        tail.append(splitter.pending)
    if not state.done and state.error is None:
        stream_failed(req, state, e.UpstreamProtocol("the pool ended the stream without [DONE]"))
        tail.append(e.sse_error_frame(ev.error_message or "", "BadGatewayError", 502))
    elif state.error is not None:
        ev.status = c.ERROR
        ev.error_class = "upstream_stream_error"
        ev.error_message = str(state.error.get("message", ""))[:300]
        ev.error_phase = clock.current_phase(upstream_done=True)
    t0 = perf()
    req.done = True
    await send({"type": _BODY, "body": b"".join(tail), "more_body": False})
    t1 = perf()
    if conn is not None:
        await conn.drained(drain_timeout_s)
    clock.end = perf()
    ev.stream_blocked_ms = ms(blocked + t1 - t0)
    apply_usage(ev, state)


async def relay_whole(
    req: Request,
    resp: aiohttp.ClientResponse,
    out_headers: list[tuple[bytes, bytes]],
    send: Send,
    deadline: Deadline,
) -> None:
    """A response that is not a stream (an error status, a non-streamed answer), sent whole."""
    ev, clock = req.event, req.clock
    try:  # a whole answer is its first token: the first-token deadline bounds it
        data = await resp.read()
    except (aiohttp.ClientError, TimeoutError) as err:
        if req.disconnected:
            return
        raise deadline.expired or upstream_error(err, "reading the response") from err
    clock.first_up = clock.last_up = time.perf_counter_ns()
    if req.capture_frames is not None:
        req.capture_whole = data
    if resp.status == 503:  # vLLM's own admission (--max-num-queued-reqs/-tokens)
        ev.status = c.REJECTED
        ev.rejection_reason = c.ENGINE_QUEUE_FULL
        ev.error_class = "admission"
        ev.error_message = error_message(data)
    elif resp.status >= 400:
        ev.status = c.CLIENT_ERROR if resp.status < 500 else c.ERROR
        ev.error_class = "upstream_status"
        ev.error_message = error_message(data)
    elif ev.route in GENERATE_ROUTES:
        read_completion(ev, data)
    await send({"type": "http.response.start", "status": resp.status, "headers": out_headers})
    req.started = True
    await send({"type": _BODY, "body": data, "more_body": False})
    req.done = True
    clock.first_sent = clock.end = time.perf_counter_ns()


async def _abort_slow_reader(
    req: Request, resp: aiohttp.ClientResponse, state: StreamState, send: Send, limit: int
) -> None:
    """The lane's ``abort`` policy: the client fell ``limit`` bytes behind; end its stream."""
    ev = req.event
    resp.close()  # vLLM aborts the request when its connection closes
    msg = f"the client fell more than {limit} bytes behind the stream; aborted (slow_client)"
    ev.status = c.CLIENT_ERROR
    ev.error_class = "slow_client"
    ev.error_message = msg
    ev.error_phase = req.clock.current_phase()
    apply_usage(ev, state)
    req.done = True
    await send(
        {
            "type": _BODY,
            "body": e.sse_error_frame(msg, "SlowClientError", 408),
            "more_body": False,
        }
    )
    req.clock.end = time.perf_counter_ns()


def stream_failed(req: Request, state: StreamState, err: e.RelayError) -> None:
    ev = req.event
    ev.status = c.ERROR
    ev.error_class = err.error_class
    ev.error_message = err.message
    ev.error_phase = req.clock.current_phase()
    apply_usage(ev, state)


async def end_stream_with_error(req: Request, send: Send) -> None:
    ev = req.event
    req.done = True
    frame = e.sse_error_frame(ev.error_message or "upstream failed", "BadGatewayError", 502)
    await send({"type": _BODY, "body": frame, "more_body": False})
    req.clock.end = time.perf_counter_ns()
