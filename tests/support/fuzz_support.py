"""What the fuzz suites share (tests/sidecar/test_fuzz_*.py):
hypothesis settings, JSON strategies, and the checks every example must pass: no crash
logged, no traceback in a body, one well-typed event per request."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from obs.events import Event
from obs.sidecar.testing import SidecarProcess

CHAT = "/v1/chat/completions"
# What the sidecar's own log must never contain: a request it could not handle.
CRASH_MARKERS = ("relay_internal_error", "Exception in ASGI application", "exporter_failed")
# The sidecar's error classes for a stream the pool answered 200 but did not finish.
STREAM_FAILURES = {"upstream_protocol", "upstream_stream_error", "upstream_timeout"}

# A fuzzed sidecar writes its event log every 20 ms, not every 0.2 s (the ``sidecar`` fixture's
# do too): each example waits for its request's event line, so the writer's interval was most
# of an example's time.
FAST_EVENTS = ("--events-flush-interval", "0.02")

# Each example is a real request and its event: 40 drawn, and each test gives the rare kinds of
# input it draws as explicit examples too.
FUZZ = settings(
    max_examples=40,
    deadline=None,
    database=None,
    derandomize=True,  # the same examples on every run: CI failures reproduce
    report_multiple_bugs=False,  # shrink one failure, not all (each example is a real request)
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # one sidecar serves every example on purpose
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ],
)


JSON_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
)
JSON_VALUES = st.recursive(
    JSON_SCALARS,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=12,
)


def _allowed_types(annotation: str) -> tuple[type, ...]:
    names = {"int": int, "str": str, "float": float, "bool": bool, "None": type(None)}
    out: list[type] = []
    for part in str(annotation).split(" | "):
        out.append(names[part])
        if part == "float":
            out.append(int)  # JSON has one number type; 3 is a fine float
    return tuple(out)


FIELD_TYPES = {f.name: _allowed_types(str(f.type)) for f in fields(Event)}


def assert_event_well_typed(event: dict[str, Any]) -> None:
    """Every field of the event has the type the schema documents (no bools for ints)."""
    assert set(event) == set(FIELD_TYPES), set(event) ^ set(FIELD_TYPES)
    for name, value in event.items():
        allowed = FIELD_TYPES[name]
        ok = isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)
        assert ok, f"event field {name}={value!r} is not {allowed}"


def log_size(sc: SidecarProcess) -> int:
    return sc.log_path.stat().st_size if sc.log_path and sc.log_path.exists() else 0


def assert_no_crash_logged(sc: SidecarProcess, since: int) -> None:
    """The sidecar logged no failure of its own after byte ``since`` of its log."""
    assert sc.log_path is not None
    with sc.log_path.open("rb") as f:
        f.seek(since)
        new = f.read().decode(errors="replace")
    for line in new.splitlines():
        if any(marker in line for marker in CRASH_MARKERS):
            last = line.replace("\\n", "\n").rstrip('"}').splitlines()[-1]
            raise AssertionError(f"the sidecar failed on this input: {last}\n{line[:2000]}")


def assert_no_traceback(body: bytes) -> None:
    assert b"Traceback" not in body and b'File "' not in body, body[:500]
