"""The body-arrival limits (issue 63) as `vllm-obs sidecar` flags: read into the settings'
``Limits``, defaults from ``Limits`` itself, and a value that is not positive refused naming
the flag (sidecar.cli.hardening)."""

from __future__ import annotations

import argparse
from typing import Any

import pytest

from obs.errors import ConfigError
from obs.sidecar.cli import hardening
from obs.sidecar.server.limits import Limits


def _kwargs(*argv: str) -> dict[str, Any]:
    """The settings fields the hardening flags set for ``argv``."""
    p = argparse.ArgumentParser()
    hardening.add_arguments(p)
    return hardening.settings_kwargs(p.parse_args(list(argv)))


def test_the_body_limits_default_to_the_limits_type() -> None:
    """Without the flags, the three body-arrival limits are Limits' own defaults."""
    limits, d = _kwargs()["limits"], Limits()
    assert (limits.body_idle_timeout_s, limits.body_stall_s, limits.min_body_rate) == (
        d.body_idle_timeout_s,
        d.body_stall_s,
        d.min_body_rate,
    )


def test_the_body_limits_are_read_from_their_flags() -> None:
    """--body-idle-timeout, --body-stall and --min-body-rate set the limits the server reads."""
    limits = _kwargs(
        "--body-idle-timeout", "4.5", "--body-stall", "0.75", "--min-body-rate", "256"
    )["limits"]
    assert (limits.body_idle_timeout_s, limits.body_stall_s, limits.min_body_rate) == (
        4.5,
        0.75,
        256,
    )


@pytest.mark.parametrize(
    ("flag", "value"),
    [("--body-idle-timeout", "0"), ("--body-stall", "-1"), ("--min-body-rate", "0")],
)
def test_a_body_limit_that_is_not_positive_is_refused(flag: str, value: str) -> None:
    """Zero or less would evict every body (or none ever): a ConfigError naming the flag."""
    with pytest.raises(ConfigError, match=flag):
        _kwargs(flag, value)
