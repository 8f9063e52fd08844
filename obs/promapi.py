"""A small client for the Prometheus HTTP API (``/api/v1``): instant and range queries.

Stdlib only, loopback-friendly (never through a configured HTTP proxy). Used by
the demo, ``vllm-obs dashboards render`` and the live-stack tests.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from typing import Any

from obs.errors import ObsError

Series = dict[str, Any]  # one result of a query: {"metric": {...}, "value"/"values": ...}


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
        query = f"?{urllib.parse.urlencode(params)}" if params else ""
        url = f"{self.url}/api/v1/{path}{query}"
        try:
            with _opener().open(url, timeout=self.timeout_s) as r:
                body = json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise QueryError(f"GET {url}: {_error_text(e)}") from e
        except (OSError, ValueError) as e:
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


def _vector(data: Any) -> list[Series]:
    if data["resultType"] == "scalar":  # e.g. vector(1) folded by the engine: keep one shape
        return [{"metric": {}, "value": data["result"]}]
    result: list[Series] = data["result"]
    return result


def _error_text(e: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(e.read())
    except (OSError, ValueError):
        return f"HTTP {e.code}"
    return f"HTTP {e.code}: {body.get('error', body)}"


def _opener() -> urllib.request.OpenerDirector:
    # Loopback only: never through a configured HTTP proxy.
    return urllib.request.build_opener(urllib.request.ProxyHandler({}))
