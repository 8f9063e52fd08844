"""The change annotations every dashboard carries: replica settings and the sidecar's config.

Each is a Grafana annotation query over Prometheus, on by default, one toggle per kind:

* **Replica settings changed**: each replica's last change
  (``pool_settings_changed_timestamp_seconds``, exported by the sidecar when a replica
  comes back with another engine, version or setting), placed at the change's time
  (the series value, in ms: ``useValueForTime``), with the old and new values.
* **Lanes config changed**: a config hash the sidecars did not run in the hour before
  (``config_info``), with the hash it replaced. A sidecar restarted with the same config
  makes none.
"""

from __future__ import annotations

from typing import Any, Final

from obs import conventions as c

from .variables import PROMETHEUS

_CHANGE = c.POOL_SETTINGS_CHANGED
_LABELS = ", ".join(_CHANGE.labels)
REPLICA_CHANGES: Final = f"1000 * max by ({_LABELS}) ({_CHANGE.name})"

_INFO = c.CONFIG_INFO.name
_HASH = c.CONFIG_HASH


def config_changes(offset: str = "2m", seen: str = "1h", resolution: str = "15s") -> str:
    """PromQL: each config hash not run in the ``seen`` before it, with the one it replaced.

    A new hash shows for ``offset`` after its first scrape (longer than the annotation's
    step, so one evaluation sees it); none shows without an older hash to compare with.
    The replaced hash is found at ``resolution`` (a subquery step, aligned to the clock): a
    config live for less than that may be missed as the old one. Keep it at or above the
    scrape interval.
    """
    new = (
        f"max by ({_HASH}, {c.CONFIG_VERSION}) ({_INFO}) unless on ({_HASH}) "
        f"max by ({_HASH}) (max_over_time({_INFO}[{seen}] offset {offset}))"
    )
    old = (
        f"label_join(topk(1, max by ({_HASH}) (max_over_time(timestamp({_INFO})"
        f"[{seen}:{resolution}] offset {offset})) unless on ({_HASH}) max by ({_HASH}) ({_INFO})), "
        f'"old_{_HASH}", ",", "{_HASH}")'
    )
    return f"({new}) * on () group_left (old_{_HASH}) (0 * {old} + 1)"


def change_annotations() -> list[dict[str, Any]]:
    """Grafana's ``annotations.list`` entries (besides its built-in one)."""
    common = {"datasource": PROMETHEUS, "enable": True, "hide": False, "step": "60s"}
    return [
        {
            **common,
            "name": "Replica settings changed",
            "iconColor": "orange",
            "expr": REPLICA_CHANGES,
            "useValueForTime": True,
            "titleFormat": "{{pool}} {{replica}}: settings changed",
            "textFormat": "{{changed}}: {{old}} -> {{new}}",
            "tagKeys": "pool,changed",
        },
        {
            **common,
            "name": "Lanes config changed",
            "iconColor": "purple",
            "expr": config_changes(),
            "titleFormat": "lanes config changed",
            "textFormat": f"config {{{{old_{_HASH}}}}} -> {{{{{_HASH}}}}} "
            f"(version {{{{{c.CONFIG_VERSION}}}}})",
            "tagKeys": _HASH,
        },
    ]
