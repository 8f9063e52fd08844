"""``vllm-obs sidecar --events-flush-interval``: a bad interval stops the start in one line.

The flag's effect (events on disk within the interval) is what the tests' sidecars rely on:
the ``sidecar`` fixture and the fuzz suites run theirs at 20 ms."""

from __future__ import annotations

import pytest

from obs.cli import main as cli_main


@pytest.mark.parametrize("value", ["0", "-1", "nan"])
def test_a_flush_interval_not_above_zero_is_a_clear_error(
    value: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """0, a negative or NaN interval: exit 2 naming the flag, before anything starts."""
    args = ["sidecar", "--upstream", "http://127.0.0.1:9", "--events", "none"]
    assert cli_main([*args, "--events-flush-interval", value]) == 2
    err = capsys.readouterr().err
    assert f"--events-flush-interval: {float(value)} is not above 0" in err, err
    assert "Traceback" not in err
