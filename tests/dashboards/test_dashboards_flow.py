"""The Admission dashboard's flow-control row: present only for a config with saturated
pools or rate-limited tenants, and every query names only the sidecar's own metrics."""

from __future__ import annotations

from obs import conventions as c
from obs.config import Config, default_config_path, load_config, parse_config
from obs.dashboards.build import all_queries, iter_panels, render
from obs.dashboards.links import ADMISSION_UID
from tests.support.promql_names import metric_names

FLOW = {
    "pools": [
        {
            "name": "gpu",
            "replicas": ["http://127.0.0.1:1"],
            "engine": {"kind": "vllm", "max_num_seqs": 16},
            "saturation": {},
        }
    ],
    "lanes": [{"name": "chat", "pool": "gpu"}],
    "default_lane": "chat",
    "tenants": {"acme": {"tokens_per_minute": 1000}},
}
PANELS = {
    "Pool queue depth by band",
    "Held by gate",
    "Refusals by gate",
    "Tenant usage against limits",
}


def _titles(config: Config) -> set[str]:
    board = render(config)[ADMISSION_UID]
    return {p.get("title", "") for p in iter_panels(board)}


def test_flow_row_only_where_configured() -> None:
    """A config using flow control gets the row's four panels; the default config none."""
    assert _titles(parse_config(FLOW)) >= PANELS
    assert not PANELS & _titles(load_config(default_config_path()))


def test_flow_queries_name_only_our_metrics() -> None:
    """Every flow-control panel query reads series the sidecar exports."""
    ours = {s for m in c.ALL_METRICS for s in m.series}
    queries = [q for q in all_queries(parse_config(FLOW)) if q.panel in PANELS]
    assert {q.panel for q in queries} == PANELS
    for q in queries:
        names = metric_names(q.expr)
        assert names and names <= ours, (q.panel, q.expr)
