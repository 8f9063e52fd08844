"""Scrape-time series of what each replica runs and of the sidecar's own config.

``pool_settings_info`` has one sample per answering replica, labelled with the engine,
the fingerprint and one label per setting the engine reports (no label at all for one it
does not: an absent setting is never an empty value). ``pool_settings_changed_timestamp_seconds``
holds each replica's last change (old and new values as labels, the change's Unix time as
the value), which the dashboards' annotation reads. ``config_info`` names the config.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from obs import conventions as c
from obs.served import Change, Served

Key = tuple[str, str]  # (pool, replica url)


class ServedCollector(Collector):
    """The info, change and config series, read from the pool monitor at scrape time."""

    def __init__(
        self,
        served: Callable[[], Mapping[Key, Served]],
        changes: Callable[[], Mapping[Key, tuple[Change, float]]],
        config: tuple[str, str],
    ) -> None:
        self._served = served
        self._changes = changes
        self._config = config

    def collect(self) -> Iterable[Metric]:
        info = Metric(c.POOL_SETTINGS_INFO.name, c.POOL_SETTINGS_INFO.help, "gauge")
        for (pool, replica), served in self._served().items():
            labels = {c.POOL: pool, c.REPLICA: replica, c.ENGINE: served.engine}
            labels[c.FINGERPRINT] = served.fingerprint
            info.add_sample(info.name, {**labels, **dict(served.settings)}, 1.0)
        changed = GaugeMetricFamily(
            c.POOL_SETTINGS_CHANGED.name,
            c.POOL_SETTINGS_CHANGED.help,
            labels=list(c.POOL_SETTINGS_CHANGED.labels),
        )
        for (pool, replica), (change, at_s) in self._changes().items():
            changed.add_metric(
                [pool, replica, ",".join(change.changed), change.old, change.new], at_s
            )
        config = GaugeMetricFamily(
            c.CONFIG_INFO.name, c.CONFIG_INFO.help, labels=list(c.CONFIG_INFO.labels)
        )
        config.add_metric(list(self._config), 1.0)
        return [info, changed, config]


class DriftCollector(Collector):
    """``pool_settings_drift``: per replica and declared setting it reports, 1 if they differ."""

    def __init__(self, drift: Callable[[], Mapping[Key, Mapping[str, bool]]]) -> None:
        self._drift = drift

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(
            c.POOL_SETTINGS_DRIFT.name,
            c.POOL_SETTINGS_DRIFT.help,
            labels=list(c.POOL_SETTINGS_DRIFT.labels),
        )
        for (pool, replica), settings in sorted(self._drift().items()):
            for setting, differs in sorted(settings.items()):
                family.add_metric([pool, replica, setting], 1.0 if differs else 0.0)
        return [family]
