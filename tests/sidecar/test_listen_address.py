"""The listener flags' HOST:PORT check (sidecar.cli.hardening.address)."""

from __future__ import annotations

import pytest

from obs.errors import ConfigError
from obs.sidecar.cli.hardening import address


def test_host_port_and_bracketed_v6_are_read() -> None:
    """`10.0.0.5:9464` and `[::1]:9464` give the host (no brackets) and the port."""
    assert address("10.0.0.5:9464", "--metrics-address") == ("10.0.0.5", 9464)
    assert address("[::1]:9464", "--metrics-address") == ("::1", 9464)


@pytest.mark.parametrize("value", ["h:", ":80", "h:0", "h:65536", "h:x", "h:\u00b2", "h:\u0664"])
def test_a_bad_port_is_one_config_error(value: str) -> None:
    """No port, 0, past 65535, or digits int() refuses ('²') are a ConfigError naming the flag."""
    with pytest.raises(ConfigError, match="--metrics-address"):
        address(value, "--metrics-address")
