"""obs.durations (one duration parser for config, rules, queries); the sidecar error mapping."""

from __future__ import annotations

from datetime import timedelta

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from obs.durations import UNIT_S, parse_duration, seconds
from obs.errors import InputError
from obs.sidecar.outcomes import (
    MethodNotAllowed,
    NotFound,
    RelayError,
    UpstreamUnavailable,
    for_status,
)

_units = st.sampled_from(sorted(UNIT_S))


@given(st.integers(min_value=0, max_value=10**6), _units)
def test_strict_and_loose_parsers_agree_on_prometheus_durations(n: int, unit: str) -> None:
    """Every Prometheus duration reads the same through both grammars."""
    text = f"{n}{unit}"
    assert parse_duration(text) == timedelta(seconds=seconds(text))


@pytest.mark.parametrize("text", ["1.5h", " 5m", "5 m", "5", "1h30m", "5M", ""])
def test_prometheus_grammar_refuses_what_only_the_cli_takes(text: str) -> None:
    """Decimals, spaces, bare numbers and compound durations are not Prometheus durations."""
    with pytest.raises(ValueError, match="is not a Prometheus duration"):
        seconds(text)


def test_loose_grammar_takes_decimals_and_spaces_and_names_bad_input() -> None:
    """The CLI grammar reads 1.5h and ' 90 s ' and refuses words with an InputError."""
    assert parse_duration("1.5h") == timedelta(minutes=90)
    assert parse_duration(" 90 s ") == timedelta(seconds=90)
    with pytest.raises(InputError, match="'soon' is not a duration"):
        parse_duration("soon")


@pytest.mark.parametrize(
    ("status", "cls"),
    [(404, NotFound), (405, MethodNotAllowed), (503, UpstreamUnavailable)],
)
def test_for_status_maps_framework_statuses_to_the_sidecar_errors(
    status: int, cls: type[RelayError]
) -> None:
    """A status the framework raises becomes the sidecar's own error of that status."""
    err = for_status(status, "why")
    assert isinstance(err, cls) and err.status == status
    body = orjson.loads(err.body())["error"]
    assert (body["message"], body["code"], body["type"]) == ("why", status, cls.type_)


def test_for_status_keeps_an_unmapped_status_with_a_generic_type() -> None:
    """An unmapped status keeps its code and the generic type ``Error``."""
    err = for_status(418, "teapot")
    assert orjson.loads(err.body())["error"] == {
        "message": "teapot",
        "type": "Error",
        "param": None,
        "code": 418,
    }
