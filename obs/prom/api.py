"""A small client for the Prometheus HTTP API (``/api/v1``): instant and range queries;
and the samples of one target's ``/metrics`` page, read as Prometheus would scrape them.

On ``requests`` (the project's synchronous HTTP client), never through a configured
HTTP proxy (Prometheus is usually on loopback or a private network). Used by
the demo, ``vllm-obs dashboards render`` and the live-stack tests.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import requests
from prometheus_client.parser import text_string_to_metric_families

from obs.errors import ObsError
from obs.procs import loopback_session

Series = dict[str, Any]  # one result of a query: {"metric": {...}, "value"/"values": ...}
Samples = dict[str, list[tuple[dict[str, str], float]]]  # a page's samples, by sample name


class PrometheusError(ObsError):
    """Prometheus could not be started or queried."""


class QueryError(PrometheusError):
    """Prometheus answered a query with an error (bad PromQL, timeout, ...)."""


class PrometheusAPI:
    """The ``/api/v1`` endpoints of the Prometheus at ``url``."""

    def __init__(self, url: str, timeout_s: float = 10.0) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s

    def get(self, path: str, params: Mapping[str, str | float] | None = None) -> Any:
        """``data`` of ``GET /api/v1/<path>``; raises :class:`PrometheusError`.

        An error answer (``"status": "error"``, HTTP 4xx/5xx with a JSON body) raises
        :class:`QueryError` with Prometheus's own message.
        """
        url = f"{self.url}/api/v1/{path}"
        try:
            with loopback_session() as session:
                r = session.get(url, params=params, timeout=self.timeout_s)
        except requests.RequestException as e:
            raise PrometheusError(f"GET {url}: {e}") from e
        url = r.url
        if r.status_code >= 400:
            raise QueryError(f"GET {url}: {_error_text(r)}")
        try:
            body = r.json()
        except ValueError as e:  # not JSON
            raise PrometheusError(f"GET {url}: {e}") from e
        if body.get("status") != "success":
            raise QueryError(f"GET {url}: {body.get('error', body)}")
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[Series]:
        """An instant query: one ``{"metric", "value": [t, "v"]}`` per series."""
        params: dict[str, str | float] = {"query": expr}
        if at is not None:
            params["time"] = at
        return _vector(self.get("query", params))

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        """A range query: one ``{"metric", "values": [[t, "v"], ...]}`` per series."""
        params: dict[str, str | float] = {"query": expr, "start": start, "end": end, "step": step}
        data = self.get("query_range", params)
        result: list[Series] = data["result"]
        return result

    def exemplars(self, expr: str, start: float, end: float) -> list[dict[str, Any]]:
        """Exemplars of the series ``expr`` selects: one ``{"seriesLabels", "exemplars":
        [{"labels", "value", "timestamp"}]}`` per series (needs exemplar storage)."""
        params: dict[str, str | float] = {"query": expr, "start": start, "end": end}
        result: list[dict[str, Any]] = self.get("query_exemplars", params)
        return result


def _vector(data: Any) -> list[Series]:
    if data["resultType"] == "scalar":  # e.g. vector(1) folded by the engine: keep one shape
        return [{"metric": {}, "value": data["result"]}]
    result: list[Series] = data["result"]
    return result


def _error_text(r: requests.Response) -> str:
    try:
        body = r.json()
    except ValueError:
        return f"HTTP {r.status_code}"
    return f"HTTP {r.status_code}: {body.get('error', body) if isinstance(body, dict) else body}"


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus exposition, by sample name: (labels, value) pairs."""
    out: Samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def scrape(base_url: str, timeout_s: float = 10.0) -> Samples:
    """The samples ``base_url``/metrics serves now."""
    r = loopback_session().get(base_url.rstrip("/") + "/metrics", timeout=timeout_s)
    r.raise_for_status()
    return parse_samples(r.text)


def sample_sum(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
    return sum(
        v for lb, v in samples.get(name, []) if all(lb.get(k) == want for k, want in labels.items())
    )
