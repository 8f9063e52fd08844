"""Label values a client chooses stay bounded: only models a pool serves (issue 22, item 7)."""

from __future__ import annotations

from pathlib import Path

import httpx

from obs import conventions as c
from obs.procs import free_port
from obs.sidecar.pools.engine_scrape import read_state
from tests.conftest import SidecarFactory
from tests.support.probes import label_values, samples

DATA = Path(__file__).parents[2] / "data"


def test_made_up_model_names_fold_into_other(sidecar: SidecarFactory) -> None:
    """300 requests naming 300 models no pool serves add no model label value but ``other``."""
    sc = sidecar(f"http://127.0.0.1:{free_port()}", args=("--model", "tiny"), traces=False)
    with httpx.Client(base_url=sc.url) as client:
        first = {"model": "tiny", "messages": [{"role": "user", "content": "x"}]}
        assert client.post("/v1/chat/completions", json=first).status_code == 503
        sc.wait_events(1)  # the JSONL writer's counter exists once it wrote
        before = sum(len(v) for v in samples(sc.url).values())  # the lane's series exist now
        for i in range(300):
            body = {"model": f"made-up-{i}", "messages": [{"role": "user", "content": "x"}]}
            headers = {"x-request-id": f"r{i}", "x-tenant": f"t{i}"}
            assert client.post("/v1/chat/completions", json=body, headers=headers).status_code
    assert label_values(sc.url, "vllm_obs_requests_total", c.MODEL) == {"tiny", c.OVERFLOW_LABEL}
    after = sum(len(v) for v in samples(sc.url).values())
    assert after - before <= 2  # the "other" model's counter and its _created


def test_models_a_replica_reports_become_known_label_values() -> None:
    """vLLM's /metrics names the served model (model_name): that one passes, others fold."""
    state = read_state("auto", (DATA / "vllm-0.32-cpu-metrics.txt").read_text())
    assert state.models == ("tiny",)
    label = c.BoundedLabel(cap=0)
    assert label("tiny") == c.OVERFLOW_LABEL
    label.allow(state.models)
    assert label("tiny") == "tiny"
    assert label("made-up") == c.OVERFLOW_LABEL
    label.allow(tuple(f"m{i}" for i in range(1000)))
    assert label("m999") == c.OVERFLOW_LABEL  # what a replica may add is bounded too
