"""How a request ends is decided once (issue 58): policy and the relay's steps hand back
values (``Refusal``, ``Ending``, a deadline's ``Expired``), ``obs.sidecar.endings.outcome``
alone makes outcomes of them, and the phase clock's ``end`` and ``dispatched`` each have one
writer. The bars are read from the code (its AST and its modules), so they cannot slip back.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from obs import conventions as c
from obs.sidecar import endings as end
from obs.sidecar import outcomes as e
from obs.sidecar.endings import Ending
from obs.sidecar.outcomes import ADMISSION, CONNECTION, TRACES, Refusal, Refused

pytestmark = pytest.mark.unit

SIDECAR = Path(importlib.import_module("obs.sidecar").__file__ or "").parent
# The modules that may build an outcome besides outcomes.py: the one function's.
BUILDERS = {"endings.py"}
OUTCOMES = {
    obj for obj in vars(e).values() if isinstance(obj, type) and issubclass(obj, e.RelayError)
}


def _modules() -> list[tuple[str, object, ast.Module]]:
    """Every module of the sidecar: its path under sidecar/, the module, its tree."""
    found: list[tuple[str, object, ast.Module]] = []
    for path in sorted(SIDECAR.rglob("*.py")):
        rel = path.relative_to(SIDECAR).as_posix()
        dotted = rel.removesuffix(".py").removesuffix("/__init__").replace("/", ".")
        name = "obs.sidecar" if dotted == "__init__" else "obs.sidecar." + dotted
        module = importlib.import_module(name)
        found.append((rel, module, ast.parse(path.read_text(encoding="utf-8"))))
    return found


def _named(module: object, node: ast.expr) -> object:
    """What ``node`` (a name, or ``alias.attr``) is in ``module``: aliases resolved."""
    if isinstance(node, ast.Name):
        return getattr(module, node.id, None)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return getattr(getattr(module, node.value.id, None), node.attr, None)
    return None


def _builds(module: object, tree: ast.Module) -> list[int]:
    """The lines where ``module`` builds an outcome: ``X(...)``, or ``raise X`` (Python
    builds it), X any outcome class under any name."""
    lines = []
    for node in ast.walk(tree):
        made = None
        if isinstance(node, ast.Call):
            made = node.func
        elif isinstance(node, ast.Raise) and node.exc is not None:
            made = node.exc if not isinstance(node.exc, ast.Call) else None
        if made is not None and _named(module, made) in OUTCOMES:
            lines.append(made.lineno)
    return lines


def test_outcomes_are_built_in_outcomes_and_endings_only() -> None:
    """No module but outcomes.py and endings.py constructs an outcome type (issue 58's bar:
    at most 5; it was 15 modules): the rest hand back a Refusal or an Ending."""
    builders = {
        rel: lines
        for rel, module, tree in _modules()
        if rel != "outcomes.py" and (lines := _builds(module, tree))
    }
    assert set(builders) <= BUILDERS, builders
    assert len(builders) <= 5


def test_the_scan_sees_an_outcome_built_under_an_alias() -> None:
    """The scan is not blind: it finds endings.py's builds, and an aliased class too."""
    tree = ast.parse("from obs.sidecar.outcomes import Internal as Bug\nraise Bug(KeyError())\n")
    assert _builds(type("M", (), {"Bug": e.Internal}), tree) == [2]
    assert _builds(end, ast.parse((SIDECAR / "endings.py").read_text(encoding="utf-8")))


def _writes(attr: str) -> list[str]:
    """Where an attribute named ``attr`` is assigned (``x.attr = ...``, ``+=``) in the sidecar."""
    sites = []
    for rel, _, tree in _modules():
        for node in ast.walk(tree):
            targets: list[ast.AST] = []
            if isinstance(node, ast.Assign):
                targets = [t for tgt in node.targets for t in ast.walk(tgt)]
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            sites += [
                f"{rel}:{t.lineno}"
                for t in targets
                if isinstance(t, ast.Attribute) and t.attr == attr
            ]
    return sites


def test_the_clocks_end_and_dispatch_each_have_one_writer() -> None:
    """``clock.end`` is written once (Relay._finish) and ``clock.dispatched`` once (the try
    loop of Relay._route_pool): issue 58's bar, where each had 4 writers."""
    assert [s.split(":")[0] for s in _writes("end")] == ["relay/relay.py"]
    assert [s.split(":")[0] for s in _writes("dispatched")] == ["relay/relay.py"]


def test_policy_imports_nothing_of_the_relay_nor_the_parts() -> None:
    """No module under policy/ imports the relay (type-only imports included), the server,
    the pools or the record: it decides, and returns its decision."""
    below = ("obs.sidecar.relay", "obs.sidecar.server", "obs.sidecar.pools", "obs.sidecar.record")
    wrong = []
    for rel, _, tree in _modules():
        if not rel.startswith("policy/"):
            continue
        for node in ast.walk(tree):
            names = []
            if isinstance(node, ast.ImportFrom) and node.module:
                names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            elif isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            wrong += [f"{rel}: {n}" for n in names if n.startswith(below)]
    assert not wrong, wrong


def test_policy_builds_no_outcome_and_asks_for_none() -> None:
    """Policy returns Refusals and Endings: it never calls the function that makes outcomes."""
    for rel, module, tree in _modules():
        if rel.startswith("policy/"):
            calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call)]
            made = {_named(module, n.func) for n in calls}
            assert end.outcome not in made and e.refused not in made, rel


ENDINGS = [
    (Ending(end.LEFT), e.ClientLeft, c.DISCONNECTED),
    (Ending(end.CUT), e.UpstreamProtocol, c.ERROR),
    (
        Ending(end.POOL_FRAME, frame={"message": "bad", "code": 400}),
        e.PoolErrorFrame,
        c.CLIENT_ERROR,
    ),
    (Ending(end.POOL_STATUS, "busy", status=503), e.EngineQueueFull, c.REJECTED),
    (Ending(end.POOL_STATUS, "boom", status=500), e.PoolStatus, c.ERROR),
    (
        Ending(end.POOL_FAILED, "pool 'p' failed: x", cause=e.UpstreamError("x")),
        e.UpstreamProtocol,
        c.ERROR,
    ),
    (
        Ending(end.POOL_FAILED, "late", cause=e.Expired(e.FIRST_TOKEN, 1.0)),
        e.UpstreamTimeout,
        c.ERROR,
    ),
    (Ending(end.SLOW_READER, limit=65536), e.SlowClientStalled, c.CLIENT_ERROR),
    (Ending(end.UNAVAILABLE, "no replica"), e.UpstreamUnavailable, c.ERROR),
    (Ending(end.ANSWER_DEADLINE, seconds=2.0), e.AnswerDeadline, c.ERROR),
    (Ending(end.SHUTDOWN), e.ShuttingDown, c.ERROR),
    (Ending(end.BUG, cause=KeyError("k")), e.Internal, c.ERROR),
    (Ending(end.FAILED, "streaming", cause=e.Expired(e.IDLE, 0.5)), e.UpstreamTimeout, c.ERROR),
    (
        Ending(end.FAILED, "streaming", cause=e.Expired(e.STALLED, 3.0)),
        e.SlowClientStalled,
        c.CLIENT_ERROR,
    ),
    (Refusal(401, "who"), e.Unauthorized, c.CLIENT_ERROR),
    (Refusal(405, "how"), e.MethodNotAllowed, c.CLIENT_ERROR),
    (Refusal(413, "big"), e.PayloadTooLarge, c.CLIENT_ERROR),
    (Refusal(429, "full", c.QUEUE_FULL, ADMISSION, 1), e.Rejected, c.REJECTED),
    (
        Refusal(
            429, "rate", c.RATE_LIMIT_TOKENS, ADMISSION, 9, ((b"x-ratelimit-limit-tokens", b"5"),)
        ),
        e.RateLimited,
        c.REJECTED,
    ),
    (Refusal(503, "memory", "body_memory", CONNECTION), e.RequestLimit, c.REJECTED),
    (Refusal(408, "slow", "body_timeout", CONNECTION), e.RequestLimit, c.CLIENT_ERROR),
    (Refusal(415, "protobuf", "media_type", TRACES), e.TraceExportRefused, c.CLIENT_ERROR),
]


def _id(v: object) -> str:
    if isinstance(v, Ending):
        return v.kind
    if isinstance(v, Refusal):
        return f"{v.by}-{v.status}"
    return getattr(v, "__name__", str(v))


@pytest.mark.parametrize(("ended", "kind", "status"), ENDINGS, ids=_id)
def test_each_ending_and_refusal_has_its_outcome(
    ended: Ending | Refusal, kind: type, status: str
) -> None:
    """The one function: each kind of ending, and each refusal by whose rule, is its outcome
    type, with the event status the client's answer implies."""
    made = end.outcome(ended)
    assert type(made) is kind
    assert made.event_status() == status
    if isinstance(ended, Refusal):
        assert (made.status, made.message) == (ended.status, ended.detail)
        assert made.retry_after == ended.retry_after or kind is not e.Rejected


def test_every_ending_kind_is_covered() -> None:
    """No kind of Ending is left out of the table above (a new one needs its case)."""
    kinds = {
        v
        for k, v in vars(end).items()
        if k.isupper() and k != "SHUTDOWN_MESSAGE" and isinstance(v, str)
    }
    assert kinds == {ended.kind for ended, _, _ in ENDINGS if isinstance(ended, Ending)}


def test_a_rate_refusal_answers_its_headers() -> None:
    """A rate limit's x-ratelimit-* headers and Retry-After reach the client from the value."""
    r = Refusal(
        429, "rate", c.RATE_LIMIT_REQUESTS, ADMISSION, 7, ((b"x-ratelimit-limit-requests", b"2"),)
    )
    headers = dict(end.outcome(r).headers())
    assert headers[b"retry-after"] == b"7" and headers[b"x-ratelimit-limit-requests"] == b"2"


def test_a_raised_refusal_maps_through_the_table() -> None:
    """A Refused that escapes to the relay's catch-all is its refusal's outcome, not a 500."""
    made = e.lower_outcome(Refused(Refusal(400, "bad field")), "reading the request")
    assert type(made) is e.BadRequest and made.message == "bad field"
