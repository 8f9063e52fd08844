"""obs.sidecar.outcomes: each outcome's status, body, SSE frame and event record agree, every
exception the transport modules raise has its outcome in the table, and the exception classes
that stand for how a request ends live in this one module."""

from __future__ import annotations

import ast
import builtins
import importlib
from pathlib import Path

import orjson
import pytest

from obs import conventions as c
from obs.events import Event
from obs.sidecar import outcomes as e
from obs.sidecar.outcomes import Rejected

SENT = [
    e.BadRequest("bad"),
    e.Unauthorized("who"),
    e.PayloadTooLarge("big"),
    e.NotFound("where"),
    e.MethodNotAllowed("how"),
    e.UpstreamUnavailable("none up"),
    e.ShuttingDown("bye"),
    e.UpstreamTimeout("idle"),
    e.SlowClientStalled("stalled"),
    e.UpstreamProtocol("broken"),
    e.Internal(KeyError("k")),
    Rejected(c.QUEUE_FULL, "full", 429, 1),
    e.RateLimited(c.RATE_LIMIT_TOKENS, "at its limit", 5, [(b"x-ratelimit-limit-tokens", b"9")]),
    Rejected(c.RATE_LIMIT_STORE, "redis down", 503, 1),
    e.RequestLimit(408, "body_timeout", "slow"),
    e.RequestLimit(503, "body_memory", "full"),
    e.TraceExportRefused(415, "media_type", "protobuf"),
]


def _frame_error(err: e.RelayError) -> dict[str, object]:
    data, done = err.sse_frame().split(b"\n\n", 1)
    assert done == b"data: [DONE]\n\n" and data.startswith(b"data: ")
    error: dict[str, object] = orjson.loads(data[len(b"data: ") :])["error"]
    return error


@pytest.mark.parametrize("err", SENT, ids=lambda err: type(err).__name__)
def test_frame_body_and_status_name_the_same_error(err: e.RelayError) -> None:
    """An error's SSE frame carries the type and code of its JSON body and HTTP status."""
    body = orjson.loads(err.body())["error"]
    frame = _frame_error(err)
    assert (frame["type"], frame["code"]) == (body["type"], body["code"]) == (err.type_, err.status)
    assert frame["message"] == body["message"] == err.message


@pytest.mark.parametrize("err", SENT, ids=lambda err: type(err).__name__)
def test_event_records_the_outcome_the_client_reads(err: e.RelayError) -> None:
    """The event's status follows the code the client reads: 4xx the client's, 5xx an error."""
    ev = Event()
    err.record(ev, "decode")
    expected = c.CLIENT_ERROR if 400 <= err.status < 500 else c.ERROR
    if isinstance(err, Rejected) or (isinstance(err, e.RequestLimit) and err.status == 503):
        expected = c.REJECTED
    assert (ev.status, ev.error_class, ev.error_phase) == (expected, err.error_class, "decode")


def test_idle_timeout_is_a_504_frame_and_an_upstream_timeout() -> None:
    """The idle timeout's frame is a 504 GatewayTimeoutError; the event says upstream_timeout."""
    err = e.UpstreamTimeout("the pool stopped sending while streaming (idle timeout: 1 s)")
    assert (_frame_error(err)["type"], _frame_error(err)["code"]) == ("GatewayTimeoutError", 504)
    ev = Event()
    err.record(ev, "decode")
    assert (ev.status, ev.error_class) == (c.ERROR, "upstream_timeout")


def test_refusals_record_their_reason() -> None:
    """A lane's refusal and vLLM's full queue are rejections; an unavailable pool is an error."""
    for err, status, reason in [
        (Rejected(c.QUEUE_FULL, "full", 429, 1), c.REJECTED, c.QUEUE_FULL),
        (e.pool_status(503, "queue full"), c.REJECTED, c.ENGINE_QUEUE_FULL),
        (e.UpstreamUnavailable("none"), c.ERROR, c.POOL_UNAVAILABLE),
    ]:
        ev = Event()
        err.record(ev, "queue")
        assert (ev.status, ev.rejection_reason) == (status, reason)


def test_pool_errors_are_judged_by_their_code() -> None:
    """The pool's error status or frame: a 4xx is the client's, a 5xx or no code the pool's."""
    cases: list[tuple[e.RelayError, str]] = [
        (e.pool_status(400, "bad"), c.CLIENT_ERROR),
        (e.pool_status(500, "oops"), c.ERROR),
        (e.PoolErrorFrame({"message": "m", "code": "404"}), c.CLIENT_ERROR),
        (e.PoolErrorFrame({"message": "m", "code": 500}), c.ERROR),
        (e.PoolErrorFrame({"message": "m"}), c.ERROR),
    ]
    for err, status in cases:
        ev = Event()
        err.record(ev, None)
        assert ev.status == status and ev.error_message == err.message


def test_internal_error_keeps_its_cause_in_the_event_only() -> None:
    """A sidecar fault: the client reads a plain 500, the event keeps the cause."""
    err = e.Internal(ValueError("x" * 400))
    assert b"ValueError" not in err.body()
    ev = Event()
    err.record(ev, None)
    assert ev.error_message is not None and "ValueError" in ev.error_message
    assert len(ev.error_message) == e.MAX_MESSAGE


def test_client_left_is_a_disconnect_without_a_message() -> None:
    """A client that left is recorded as client_disconnect, with no message of ours."""
    ev = Event()
    e.ClientLeft().record(ev, "decode")
    assert (ev.status, ev.error_class, ev.error_message) == (
        c.DISCONNECTED,
        "client_disconnect",
        None,
    )


SIDECAR = Path(__file__).resolve().parents[2] / "sidecar"
# The modules that raise what the relay gets from below: the pool client, the server's
# connection and exchange, the body reader and the deadlines.
TRANSPORT = (
    "pools/upstream.py",
    "pools/pool_conn.py",
    "server/connection.py",
    "server/wire.py",
    "server/client.py",
    "relay/bodies.py",
    "relay/deadline.py",
)
# Exception classes outside outcomes.py, each no request's end.
NOT_OUTCOMES = {
    ("pools/engine_scrape.py", "ExpositionError"): "a replica's /metrics page that does not parse",
}


def _module(path: str) -> object:
    return importlib.import_module("obs.sidecar." + path.removesuffix(".py").replace("/", "."))


def _exceptions_made(path: str) -> set[type[BaseException]]:
    """The exception classes ``path`` raises or constructs (``raise X(...)``, ``fail(X(...))``)."""
    module = _module(path)
    tree = ast.parse((SIDECAR / path).read_text(encoding="utf-8"))
    found: set[type[BaseException]] = set()
    for node in ast.walk(tree):
        target = node.exc if isinstance(node, ast.Raise) else node
        if isinstance(target, ast.Call):
            target = target.func
        if isinstance(node, ast.Raise | ast.Call) and isinstance(target, ast.Name | ast.Attribute):
            obj = None
            if isinstance(target, ast.Name):  # the module's own name, or a builtin's
                obj = getattr(module, target.id, getattr(builtins, target.id, None))
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                owner = getattr(module, target.value.id, None)
                obj = getattr(owner, target.attr, None)
            if isinstance(obj, type) and issubclass(obj, BaseException):
                found.add(obj)
    return found


@pytest.mark.parametrize("path", TRANSPORT)
def test_every_exception_a_transport_module_raises_has_an_outcome(path: str) -> None:
    """Each exception class a transport module raises or builds maps to an outcome through
    the table (its own class or a base, never a catch-all), as httpx tests its map."""
    made = _exceptions_made(path)
    catch_all = {BaseException, Exception, object}
    missing = [
        cls.__name__
        for cls in made
        if not any(base in e.LOWER for base in cls.__mro__ if base not in catch_all)
    ]
    assert not missing, f"{path} raises exceptions obs.sidecar.outcomes.LOWER does not map"


def test_the_transport_scan_sees_the_pool_clients_errors() -> None:
    """The scan is not empty: the pool client builds UpstreamError and ConnectFailed, the
    server raises its refusals (``Refused``, a ``Refusal`` its parser's callback found)."""
    assert {e.UpstreamError, e.ConnectFailed} <= _exceptions_made("pools/upstream.py")
    assert e.Refused in _exceptions_made("server/connection.py")


@pytest.mark.parametrize(
    ("err", "outcome"),
    [
        (e.ConnectFailed("refused"), e.UpstreamUnavailable),
        (e.UpstreamError("bad chunk"), e.UpstreamProtocol),
        (TimeoutError(), e.UpstreamTimeout),
        (ConnectionResetError(), e.UpstreamProtocol),
        (RuntimeError("impossible"), e.Internal),
        (KeyError("ours"), e.Internal),
        (e.SlowClientStalled("stalled"), e.SlowClientStalled),
    ],
    ids=lambda v: type(v).__name__,
)
def test_lower_errors_map_to_their_outcome(err: BaseException, outcome: type) -> None:
    """The table: the pool client's errors, a deadline, a socket error, our own bug."""
    assert type(e.lower_outcome(err, "streaming")) is outcome


def test_exception_classes_for_how_a_request_ends_live_in_outcomes() -> None:
    """No module of the sidecar but outcomes.py defines an exception class (the few that
    stand for no request's end are named, with why)."""
    found = []
    for path in sorted(SIDECAR.rglob("*.py")):
        rel = path.relative_to(SIDECAR).as_posix()
        if rel in ("outcomes.py", "__init__.py"):
            continue
        module = _module(rel.removesuffix("/__init__.py"))
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for name in (node.name for node in tree.body if isinstance(node, ast.ClassDef)):
            obj = getattr(module, name, None)
            exc = isinstance(obj, type) and issubclass(obj, BaseException)
            if exc and (rel, name) not in NOT_OUTCOMES:
                found.append(f"{rel}:{name}")
    assert not found, "define these in obs.sidecar.outcomes: " + ", ".join(found)


# vLLM's 500 body when PyTorch runs out of GPU memory, and llama.cpp's allocation failure.
OOM_MESSAGES = [
    "CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.15 GiB total capacity)",
    "torch.OutOfMemoryError: CUDA error: out of memory",
    "failed to allocate compute buffers",
]


@pytest.mark.parametrize("message", OOM_MESSAGES)
def test_an_engine_out_of_memory_is_its_own_error_class(message: str) -> None:
    """A 5xx status or error frame whose text says the engine ran out of memory records
    error_class oom (an error, charged to the pool), not upstream_status / _stream_error."""
    for err in (e.pool_status(500, message), e.PoolErrorFrame({"message": message, "code": 500})):
        ev = Event(request_id="r")
        err.record(ev, "decode")
        assert (ev.status, ev.error_class) == (c.ERROR, "oom")


def test_other_failures_and_client_errors_are_not_oom() -> None:
    """Another 5xx keeps upstream_status; a 400 that mentions memory is the client's."""
    assert e.pool_status(500, "engine dead").error_class == "upstream_status"
    assert e.pool_status(400, "prompt too long: out of memory").error_class == "upstream_status"
    assert e.PoolErrorFrame({"message": "x"}).error_class == "upstream_stream_error"
