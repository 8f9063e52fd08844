"""The relay: one ASGI handler per request, from the client to a pool and back.

Hot path per upstream chunk (obs.sidecar.relay.streaming, in the pool socket's
callback): one ``perf_counter_ns``, frame split, ``classify``, a list append
for the inter-token gap, and a write to the client's transport. All
per-request bookkeeping (event, spans, metrics) happens once, after the last
byte: the relay tells its ``Recorder`` (obs.sidecar.record.recorder: processors, then
the exporters) when the record starts and hands it the finished record at the end, and
reads nothing back.
How a request ends is a value its step hands back (a ``Refusal``, an ``Ending``: obs.sidecar.
endings), made the outcome once (``endings.outcome``: obs.sidecar.outcomes), settled on the
request and answered through obs.sidecar.relay.respond.
"""

from __future__ import annotations

import asyncio
import time
from functools import partial
from typing import Any

import structlog

from obs import conventions as c
from obs.config import Lane
from obs.lanes import Classifier
from obs.record import Finished
from obs.sidecar import endings as end
from obs.sidecar import outcomes as e
from obs.sidecar.endings import Ending
from obs.sidecar.outcomes import (
    FIRST_TOKEN,
    ConnectFailed,
    Expired,
    FallBack,
    Refusal,
    Refused,
    UpstreamError,
)
from obs.sidecar.policy import traffic
from obs.sidecar.policy.admission import LaneGate, Ticket, cost_of
from obs.sidecar.policy.auth import Tenants
from obs.sidecar.policy.recognition import Recognizer
from obs.sidecar.pools.homes import ResponseHomes, owner_of
from obs.sidecar.pools.pools import PoolSet, Replica
from obs.sidecar.pools.upstream import Response, Upstream
from obs.sidecar.record.capture import TextCapture
from obs.sidecar.record.recorder import Recorder, Start
from obs.sidecar.relay import stored
from obs.sidecar.relay.bodies import (
    MAX_JSON_ELEMENTS,
    MAX_MODEL_CHARS,
    BodyParser,
    read_body,
)
from obs.sidecar.relay.deadline import Deadline
from obs.sidecar.relay.flow import FlowControl, admit_lane
from obs.sidecar.relay.payloads import (
    ENDED_STREAMS,
    GENERATE_ROUTES,
    dump_body,
    read_fields,
    request_headers,
    single_choice,
    upstream_headers,
    usage_options,
    wants_usage,
)
from obs.sidecar.relay.request import EventTime, Plan, Request
from obs.sidecar.relay.respond import fail
from obs.sidecar.relay.streaming import respond, stream_at_head
from obs.sidecar.server.client import body_ns, client_conn, received_ns
from obs.sidecar.types import Receive, Scope, Send
from obs.tracecontext import new_ids, new_request_id

log = structlog.get_logger("vllm_obs.relay")

# Past --shutdown-grace, how long a cut stream's buffered bytes (up to the lane's slow_client
# buffer, then the error frame) may take to reach a slow client before the process exits.
SHUTDOWN_FLUSH_S = 5.0
NO_CONNECTION = (
    "the relay runs on the sidecar's own server (obs.sidecar.serve), which hands it the "
    "client connection; this ASGI server does not"
)


class Relay:
    """ASGI app for the relayed routes."""

    def __init__(
        self,
        classifier: Classifier,
        pools: PoolSet,
        recorder: Recorder,
        upstream: Upstream,
        *,
        gates: dict[str, LaneGate],
        tenants: Tenants,
        max_body_bytes: int,
        pool_keys: dict[str, str] | None = None,
        capture: TextCapture | None = None,
        max_json_elements: int = MAX_JSON_ELEMENTS,
        recognizer: Recognizer | None = None,
        split_salt: bytes = b"",
        flow: FlowControl | None = None,
        worker: tuple[int, int] | None = None,
        routes: frozenset[str] = frozenset(),
        homes: ResponseHomes | None = None,
    ) -> None:
        self.classifier, self.split_salt = classifier, split_salt  # salt: obs.splits
        self.recognizer = recognizer or Recognizer(classifier.config.recognition)
        self.pools = pools
        self.recorder = recorder  # where each finished request's record goes, once
        self.upstream = upstream
        self.max_body_bytes = max_body_bytes
        self.pool_keys = pool_keys or {}
        self.capture = capture
        self.json = BodyParser(max_json_elements)
        self.gates = gates  # each lane's admission gate, by lane name
        self.tenants = tenants
        self.flow = flow  # rate limits and saturated pools (obs.sidecar.relay.flow)
        self.worker = worker  # (index, count) under --workers: our span ids name us
        self.routes = routes  # the paths the app sends here (the relayed routes)
        self.homes = homes or ResponseHomes()  # stored responses' replicas (relay.stored)
        self._running: set[asyncio.Task[Any]] = set()  # handlers, for shutdown to wait on
        self._event_time = EventTime()
        self.needs_prompt_tokens = (
            classifier.needs_prompt_tokens
            or any(g.needs_prompt_tokens for g in self.gates.values())
            or (flow is not None and flow.needs_prompt_tokens)
        )
        self.recognizer.needs_shape = self.needs_prompt_tokens or classifier.needs_shape

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path, query = scope["path"], scope.get("query_string")
        route = path if path in self.routes else stored.route_of(path) or path
        req = Request(route, received_ns(scope))
        if query or route is not path:  # the pool reads the path and query the client sent
            req.target = f"{path}?{query.decode('latin-1')}" if query else path
        req.conn = client_conn(scope)
        task = asyncio.current_task()
        if task is not None:
            self._running.add(task)
        try:
            await self._handle(req, scope, receive, send)
        except e.RelayError as err:
            await fail(req, send, err, req.clock.current_phase())
        except Refused as refused:  # the request side's refusal: the client's mistake
            await fail(req, send, refused.refusal, req.clock.current_phase())
        except asyncio.CancelledError:
            # The server cancels the requests still running when --shutdown-grace ends: close the
            # upstream (vLLM aborts), tell the client, and log the request like any other.
            if task is not None:
                task.uncancel()
            if req.response is not None:
                req.response.close()
            if not req.done:  # else the client has the whole answer: it stays as it was
                await fail(req, send, Ending(end.SHUTDOWN), req.clock.current_phase())
            if req.conn is not None:  # what is still buffered reaches the client before exit
                await req.conn.drained(SHUTDOWN_FLUSH_S)
        except Exception as err:  # never a traceback to the client, never a lost event
            log.exception("relay_internal_error", request_id=req.event.request_id)
            await fail(req, send, Ending(end.BUG, cause=err), req.clock.current_phase())
        finally:
            self._finish(req)
            # Recorded: let go of the outcome (raised, its traceback's frames hold the request)
            # and of the pool's response (its failure's too), so a refused or failed request is
            # freed by reference counting, not left to the cycle collector.
            req.outcome = req.response = None
            if task is not None:
                self._running.discard(task)

    async def wait_running(self, timeout_s: float) -> None:
        """Until the requests still running end (cut at the end of the shutdown grace, they
        send their last words and write their events), at most ``timeout_s``."""
        if self._running:
            await asyncio.wait(self._running, timeout=timeout_s)

    # ---- request side -------------------------------------------------------------------

    async def _handle(self, req: Request, scope: Scope, receive: Receive, send: Send) -> None:
        ev = req.event
        headers = request_headers(scope)
        rid = headers.get("x-request-id") or new_request_id()  # 64 unpredictable bits, as vLLM's
        ev.request_id = rid[:128]
        req.ids = new_ids(headers.get("traceparent"), self.worker)
        ev.trace_id, ev.span_id = req.ids.trace_id_hex, req.ids.span_id_hex
        tenant = self.tenants.resolve(headers)
        if isinstance(tenant, Refusal):
            raise Refused(tenant)
        ev.tenant = tenant
        req.share_key = self.tenants.share_key(ev.tenant, scope.get("client"))
        if req.conn is None:  # one hot path: the client connection of the sidecar's own server
            raise end.outcome(Ending(end.BUG, NO_CONNECTION))
        method = req.method = stored.method_of(ev.route)  # POST, or GET: a stored response
        if scope["method"] != method:
            why = f"{scope['method']} is not allowed on {scope['path']}; use {method}"
            raise Refused(Refusal(405, why))
        raw = await read_body(receive, self.max_body_bytes)
        if raw is None:  # the client left, or the server refused the body
            refused = req.conn.refusal if req.conn is not None else None
            if refused is None:
                req.disconnected = True
                return
            raise Refused(refused)  # what the server answered is what the event says
        # The server-side clock starts now: the upload was the client's time (upload_ms).
        req.body_complete(body_ns(scope))  # ev.ts: when the record ends (_finish)
        body: dict[str, Any] | None = None
        generate = ev.route in GENERATE_ROUTES
        if generate or headers.get("content-type", "").startswith("application/json"):
            # A body that is not a JSON object goes to the pool as it is: the client gets the
            # pool's own 400, byte for byte, and the event records it as the pool's answer.
            body = await self.json.parse(raw)
        if generate and body is not None:
            req.pending_body = body  # read as it is sent (Request.annotate)
        read = read_fields(ev.route, body, MAX_MODEL_CHARS)  # as the engine, or 400 naming it
        ev.model, ev.stream, ev.max_tokens = read.model, read.stream, read.max_tokens
        rec, cl = self.recognizer, self.classifier
        attrs, req.client_id, req.prefix_key = rec.attrs(cl, ev, headers, body, scope)
        lane, ev.class_source = cl.decide(attrs)
        ev.lane = lane.name
        traffic.place(ev, lane, headers, scope, attrs, self.split_salt)  # pool (arm), priority
        if ev.route in stored.PLANNED:  # the Responses API's state, and who owns it
            owner = owner_of(self.tenants.key_hash(headers), ev.tenant)
            req.stored = stored.plan(ev, scope, body, self.homes, owner, req.client_id)
            if req.stored is not None and req.stored.rewrite:
                raw = dump_body(body or {})
        ev.model = ev.model or self.pools.default_model(ev.pool or lane.pool)  # as the engine
        pools = (ev.pool, lane.fallback) if lane.fallback else (ev.pool,)
        req.placed = Start(ev, req.ids, pools)  # the record begins as it is sent (_sent)
        gate = self.gates[lane.name]
        refusal = gate.check(attrs.prompt_tokens, ev.max_tokens)
        if refusal is not None:
            raise Refused(refusal)
        cost = cost_of(attrs.prompt_tokens, ev.max_tokens)
        inject = False
        usage = generate and body is not None and ev.stream and not wants_usage(body)
        if usage and body is not None and single_choice(body):
            body["stream_options"] = usage_options(body)
            raw = dump_body(body)
            inject = ev.usage_injected = True
        if self.capture is not None and ev.route in ENDED_STREAMS:  # the generating APIs
            req.capture_body = body if self.capture.prompt else None
            req.capture_frames = [] if self.capture.output else None
        await self._dispatch(req, Plan(lane, gate, cost, headers, raw, inject), receive, send)

    # ---- upstream side ------------------------------------------------------------------

    async def _dispatch(self, req: Request, plan: Plan, receive: Receive, send: Send) -> None:
        """Admit the request through its lane's gate, then try up to two replicas."""
        # A client that leaves from here on is seen at once: its connection calls back.
        conn = req.conn
        assert conn is not None  # _handle refuses a request without one
        conn.on_disconnect(lambda: self._client_left(req))
        ev = req.event
        ticket = req.ticket = Ticket(req.share_key, plan.cost, priority=ev.priority or 0)
        req.gate = plan.gate
        try:
            if self.flow is not None:
                await self.flow.charge(req, plan, self.tenants.key_hash(plan.headers))
            admitted = await admit_lane(req, plan, ticket)
            if admitted:  # else the client left while queued
                req.admitted = True
                self.recognizer.prefixes.remember(req.prefix_key)  # refused ones never
                if self.flow is None or await self.flow.admit_pool(req, plan):
                    await self._route(req, plan, send)
        finally:
            req.release()
            conn.on_disconnect(None)

    async def _route(self, req: Request, plan: Plan, send: Send) -> None:
        """To the request's pool, then, if it refused, failed or timed out before the first
        byte, to the lane's fallback pool (obs.sidecar.policy.traffic)."""
        if req.stored is not None and req.stored.lookup:  # every replica is tried already
            await self._route_pool(req, plan, send, req.event.pool or plan.lane.pool, False)
            return
        ev = req.event
        fallback = traffic.fallback_pool(plan.lane, ev.pool)
        try:
            await self._route_pool(req, plan, send, ev.pool, fallback is not None)
            return
        except (FallBack, e.UpstreamTimeout) as err:
            started, gone = req.started, req.disconnected
            decided = traffic.fallback_reason(
                err, plan.lane, fallback, stream=ev.stream, started=started, gone=gone
            )
            if decided is None:  # the error stands
                raise
            if isinstance(decided, Ending):  # the lane's answer deadline
                raise end.outcome(decided) from err
            reason = decided
        assert fallback is not None  # policy decided otherwise
        log.info("lane_fallback", lane=ev.lane, pool=ev.pool, to=fallback, reason=reason)
        req.response = None  # the time on the refusing pool counts as queueing (_route_pool)
        ev.fallback_from, ev.fallback_reason, ev.pool = ev.pool, reason, fallback
        await self._route_pool(req, plan, send, fallback, False)

    async def _route_pool(
        self, req: Request, plan: Plan, send: Send, pool: str, may_fall_back: bool
    ) -> None:
        ev, lane = req.event, plan.lane
        assert req.ids is not None
        pass_auth = not self.tenants.checks_keys
        up_headers = upstream_headers(plan.headers, ev.request_id, req.ids.traceparent(),
                                      self.pool_keys.get(pool), pass_auth)  # fmt: skip
        last_err: Exception | None = None
        affinity = None
        if lane.routing == "prefix_affinity":
            req.annotate()
            affinity = ev.prefix_fingerprint
        kept = req.stored
        candidates = stored.candidates(kept, self.pools, pool, affinity)  # up to two, or all
        tries = enumerate(candidates)
        while True:
            attempt, replica = next(tries, (len(candidates), None))
            gone = req.disconnected and replica is not None
            # The one place the dispatch moves: to this try's start, or back to 0 when none is
            # on (still queued): a try the pool refused to connect, failed over (503, or a
            # stored response elsewhere) or sent to the fallback pool ends at the next one.
            req.clock.dispatched = 0 if replica is None or gone else time.perf_counter_ns()
            if replica is None or gone:
                break
            ev.replica, ev.pool = replica.url, replica.pool
            ev.settings_fingerprint = replica.served.fingerprint if replica.served else None
            replica.stamp_dispatch(ev)
            with replica.lease(len(plan.raw) // 4, ev, req.clock):  # ~4 bytes a token: prefill
                try:
                    resp, deadline = await self._post(req, replica, lane, plan, up_headers)
                except ConnectFailed as err:  # never reached the pool: still queued
                    self.pools.mark_failed(replica)
                    last_err = err
                    log.warning("upstream_connect_failed", replica=replica.url, attempt=attempt)
                    continue
                try:
                    self.pools.mark_ok(replica)
                    if stored.next_replica(kept, resp.status) and attempt + 1 < len(candidates):
                        # vLLM sheds load with 503 (--max-num-queued-reqs): try the other one;
                        # a stored response not on this replica (404): the next one.
                        resp.release()
                        log.info("upstream_failover", replica=replica.url, status=resp.status)
                        continue
                    if may_fall_back and traffic.refused(resp.status):
                        resp.release()  # nothing of it reached the client: to the fallback
                        raise FallBack(c.FALLBACK_SERVER_ERROR)
                    req.response = resp
                    try:
                        slow = lane.admission.slow_client
                        await respond(req, resp, plan.inject, send, slow, deadline)
                    finally:
                        resp.release()
                    stored.learn(kept, resp.status, req.answer_id, replica, self.homes)
                finally:
                    deadline.cancel()
                if req.clock.first_up:  # a cold start ends at the replica's first token
                    ago_s = (time.perf_counter_ns() - req.clock.first_up) / 1e9
                    self.pools.served_token(replica, time.time() - ago_s)
                return
        if gone:
            return
        decided = traffic.unavailable(pool, last_err, may_fall_back)
        if isinstance(decided, Ending):
            raise end.outcome(decided)
        raise FallBack(decided)

    async def _post(
        self, req: Request, replica: Replica, lane: Lane, plan: Plan, headers: dict[str, str]
    ) -> tuple[Response, Deadline]:
        """The pool's response headers (a 2xx stream is started to the client as they come:
        ``stream_at_head``), and the deadline that watches the response from dispatch (its
        first token within the lane's ``first_token_s``, then each silence); raises
        ``ConnectFailed`` (no connection: try another replica) or a relay error."""
        t, up = lane.timeouts, self.upstream
        conn = up.idle(replica.url)
        if conn is None:  # a new connection: made within the first-token deadline too
            try:
                async with asyncio.timeout(t.first_token_s):
                    conn = await up.connect(replica.url, t.connect_s)
            except TimeoutError as err:
                raise end.failed(Expired(FIRST_TOKEN, t.first_token_s), "connecting") from err
        resp = up.send(conn, replica.url, req.target, plan.raw, headers, req.method)
        slow = lane.admission.slow_client
        deadline = Deadline(
            resp, req.clock.dispatched, t.first_token_s, t.idle_s, slow.max_blocked_s, req.conn
        )
        resp.on_head = partial(stream_at_head, req, plan.inject, slow, deadline)
        try:
            self._sent(req)  # while the pool works
            await resp.wait_head()
        except UpstreamError as err:  # the deadline closed it (its verdict), or the pool failed
            deadline.cancel()
            how = f"pool {replica.pool!r} failed: {err}"
            raise end.outcome(Ending(end.POOL_FAILED, how, cause=err)) from err
        except BaseException:  # cancelled, or our own bug: the response is never reused
            deadline.cancel()
            resp.close()
            raise
        return resp, deadline

    def _client_left(self, req: Request) -> None:
        if not (req.done or req.delivered):
            req.disconnected = True
            if req.response is not None:
                req.response.close()  # closes the connection: vLLM aborts the request
            elif req.gate is not None and req.ticket is not None and not req.admitted:
                req.gate.withdraw(req.ticket)
            elif self.flow is not None:
                self.flow.withdraw(req)

    # ---- failure and finish -------------------------------------------------------------

    def _sent(self, req: Request) -> None:
        """Once a placed request is written to its pool (or ends never sent): what only its
        record needs (processors see it begin, its classification is counted, its body read
        for the record: ``Request.annotate``), done while the pool works, off its TTFT."""
        start, req.placed = req.placed, None
        if start is not None:
            req.annotate()
            self.recognizer.decided(start.event.lane or "", start.event.class_source or "")
            self.recorder.start(start)

    def _finish(self, req: Request) -> None:
        self._sent(req)  # a request never sent is recorded alike
        ev, clock = req.event, req.clock
        # The record ends here, once: when the client's side acknowledged a stream's last
        # byte (ClientConn.drained), else now, just after the last send (no await since).
        acked = req.conn.acked_ns if req.conn is not None else 0
        clock.end = acked or time.perf_counter_ns()
        ev.ts = self._event_time(req.wall_ns)
        if req.disconnected:  # the client left: unless it ended otherwise before
            req.settle(Ending(end.LEFT), clock.current_phase())
        kept = None
        if self.capture is not None:  # redacted into the event by the capture step
            kept = (req.capture_body, req.capture_frames, req.capture_whole)
        if self.flow is not None:
            self.flow.settle(req)
        # The client's next request on this connection, relayed too, is served first: its
        # dispatch before this record's exporting (NextTurn; a /metrics request still waits).
        after = req.conn.next_path() if req.conn is not None else None
        self.recorder.end(
            Finished(
                ev, clock, req.wall_ns, req.ids or new_ids(None), req.itl, req.operation,
                req.first_read_chunks, client_id=req.client_id, captured=kept,
                next_waiting=after in self.routes,
            )
        )  # fmt: skip
