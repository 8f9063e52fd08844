"""The Alertmanager routing for the generated alerts: one page per pool incident.

* **Pages** are grouped by ``pool``: every burn-rate page of a pool's lanes (and the pool's
  own down page) arrives as one notification that lists the lanes; ``repeat_interval`` 1h.
* **Tickets** are grouped by ``alertname``, ``lane``, ``pool`` and ``slo``: one per thing to
  look at.
* **Inhibitions**: a page about a pool mutes that pool's tickets (the on-call is already
  on it); the pool's own down alerts (``VllmObsPoolDown``, ``VllmObsPoolAbsent``) mute every
  lane alert of the pool, pages included (the lanes fail because the pool is down); its
  saturation alerts (held at its target, KV cache full, engine queue deep, preempting),
  tickets themselves, mute the pool's lane tickets only: a ticket never mutes a page.

Receivers ``page`` and ``ticket`` are empty as shipped: add your integrations to them.
"""

from __future__ import annotations

from typing import Any

from obs import conventions as c

ALERTNAME = "alertname"  # Prometheus's own label on every alert
PAGE, TICKET, DEFAULT = "page", "ticket", "default"
POOL_DOWN = (c.ALERT_POOL_DOWN, c.ALERT_POOL_ABSENT)
POOL_SATURATION = (
    c.ALERT_POOL_HELD_AT_SATURATION,
    c.ALERT_KV_CACHE_USAGE_HIGH,
    c.ALERT_ENGINE_QUEUE_DEEP,
    c.ALERT_POOL_PREEMPTING,
)
TICKET_GROUP_BY = [ALERTNAME, c.LANE, c.POOL, c.SLO_LABEL]
HEADER = """\
Alertmanager for the vllm-obs alerts (docs/alerts.md, "Routing"). Add your integrations
(pagerduty_configs, slack_configs, webhook_configs, ...) to the page and ticket receivers;
as written, alerts are visible in Alertmanager's UI and Grafana only."""


def _one_of(label: str, values: tuple[str, ...]) -> str:
    return f'{label}=~"{"|".join(values)}"'


def alertmanager_config(receivers: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The Alertmanager config as plain data (it reads labels every generated alert carries,
    whatever the lanes config); ``receivers`` fills the named receivers (``page``,
    ``ticket``, ``default``) with integrations (as shipped: none)."""
    filled = receivers or {}
    has_pool = f'{c.POOL}=~".+"'
    has_lane = f'{c.LANE}=~".+"'
    return {
        "route": {
            "receiver": DEFAULT,
            "group_by": TICKET_GROUP_BY,
            "group_wait": "30s",
            "group_interval": "5m",
            "repeat_interval": "4h",
            "routes": [
                {
                    "matchers": [f'{c.SEVERITY}="{PAGE}"'],
                    "receiver": PAGE,
                    "group_by": [c.POOL],
                    "repeat_interval": "1h",
                },
                {
                    "matchers": [f'{c.SEVERITY}="{TICKET}"'],
                    "receiver": TICKET,
                    "group_by": TICKET_GROUP_BY,
                    "repeat_interval": "12h",
                },
            ],
        },
        "inhibit_rules": [
            {
                "source_matchers": [f'{c.SEVERITY}="{PAGE}"', has_pool],
                "target_matchers": [f'{c.SEVERITY}="{TICKET}"'],
                "equal": [c.POOL],
            },
            {
                "source_matchers": [_one_of(ALERTNAME, POOL_DOWN)],
                "target_matchers": [has_lane],
                "equal": [c.POOL],
            },
            {
                "source_matchers": [_one_of(ALERTNAME, POOL_SATURATION)],
                "target_matchers": [has_lane, f'{c.SEVERITY}="{TICKET}"'],
                "equal": [c.POOL],
            },
        ],
        "receivers": [{"name": n, **filled.get(n, {})} for n in (DEFAULT, PAGE, TICKET)],
    }


def header() -> str:
    """The explanation written above the generated config (as YAML comments)."""
    return "".join(f"# {line}\n" if line else "#\n" for line in HEADER.splitlines())
