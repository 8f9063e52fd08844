"""What a change's settings fingerprints stand for, looked up in Prometheus.

A request event carries only the fingerprint of the settings it was served under; the
settings themselves are the labels of ``vllm_obs_pool_settings_info`` with that
``fingerprint``. ``compare --around-changes --prometheus URL`` asks Prometheus for both
sides of each replica's change and adds what differs (``prefix_caching=false ->
prefix_caching=true``) to the change's text. A fingerprint Prometheus no longer holds
leaves the text as it was.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC
from typing import Final

from obs import conventions as c
from obs.prom.api import PrometheusAPI
from obs.query.changes import Change
from obs.served import Served, change_between

LOOKBACK: Final = "1d"  # how far before the evaluation time a side's series is looked for
AFTER_S: Final = 600.0  # evaluated this long after the change: the new series is scraped by then
_FINGERPRINT: Final = re.compile(r"[0-9a-f]{8}")


def settings_of(api: PrometheusAPI, fingerprint: str, at_s: float) -> Served | None:
    """The settings a fingerprint stands for, from its info series (None if not found)."""
    if not _FINGERPRINT.fullmatch(fingerprint):
        return None
    selector = f'{c.POOL_SETTINGS_INFO.name}{{{c.FINGERPRINT}="{fingerprint}"}}'
    expr = f"last_over_time({selector}[{LOOKBACK}])"
    for series in api.query(expr, at_s):
        labels = dict(series["metric"])
        engine = labels.pop(c.ENGINE, "")
        served = Served.of(engine, labels)
        if served.fingerprint == fingerprint:
            return served
    return None


def describer(url: str, now_s: float) -> Callable[[list[Change]], list[Change]]:
    """A ``describe`` for ``around_changes`` that asks the Prometheus at ``url``."""
    api = PrometheusAPI(url)

    def describe(changes: list[Change]) -> list[Change]:
        out = []
        for ch in changes:
            if ch.replica is not None:
                at_s = min(now_s, ch.at.replace(tzinfo=UTC).timestamp() + AFTER_S)
                old, new = settings_of(api, ch.old, at_s), settings_of(api, ch.new, at_s)
                diff = change_between(("", ""), old, new) if old and new else None
                if diff is not None:
                    ch = replace(ch, what=f"{ch.what} ({diff.old} -> {diff.new})")
            out.append(ch)
        return out

    return describe
