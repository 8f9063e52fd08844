"""The request line the relay sends its pool (path, query, method) for the Responses API's
stored responses, vLLM's other serving routes and a query string, and what it keeps to itself.

The pool is ``ScriptedUpstream`` (a fake, in this process): what matters here is the request
line the pool was sent (its path, query and method), which a real engine does not report.
Retrieval from a real vLLM's store: tests/sidecar/test_stored_responses_vllm.py."""

from __future__ import annotations

import httpx
import pytest

from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import InProcessSidecar, lane_config, request_id
from tests.support.scripted_upstream import ScriptedUpstream

RID = "resp_0123456789abcdef"


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """One lane on the scripted pool."""
    return inproc(lane_config({"main": [scripted.url]}))


def test_a_query_string_reaches_the_pool_and_the_event_names_the_route_alone(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A client's ``?api-version=...`` goes to the pool with the path, as a proxy sends it;
    the event's route has no query (before: the relay dropped it)."""
    rid = request_id()
    body = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    r = httpx.post(
        f"{sidecar.url}/v1/chat/completions?api-version=2024-10-21&x=%20y",
        json=body, headers={"x-request-id": rid}, timeout=10,
    )  # fmt: skip
    assert r.status_code == 200
    assert scripted.received[-1][0] == "/v1/chat/completions?api-version=2024-10-21&x=%20y"
    assert sidecar.event(rid)["route"] == "/v1/chat/completions"


def test_a_retrieval_is_a_get_to_the_pool_under_one_route_label(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """``GET /v1/responses/{id}?stream=true`` reaches the pool as sent; its event's route is
    the template (one label whatever the id) and says it asked for a stream."""
    rid = request_id()
    url = f"{sidecar.url}/v1/responses/{RID}?stream=true&starting_after=2"
    assert httpx.get(url, headers={"x-request-id": rid}, timeout=10).status_code == 200
    assert scripted.gets[-1] == f"/v1/responses/{RID}?stream=true&starting_after=2"
    ev = sidecar.event(rid)
    assert (ev["route"], ev["stream"], ev["status"]) == ("/v1/responses/{response_id}", True, "ok")


def test_a_cancellation_is_a_post_to_the_pool(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """``POST /v1/responses/{id}/cancel`` (no body) reaches the pool as a POST of that path."""
    rid = request_id()
    url = f"{sidecar.url}/v1/responses/{RID}/cancel"
    assert httpx.post(url, headers={"x-request-id": rid}, timeout=10).status_code == 200
    assert scripted.received[-1] == (f"/v1/responses/{RID}/cancel", b"")
    assert sidecar.event(rid)["route"] == "/v1/responses/{response_id}/cancel"


def test_a_wrong_method_is_405_naming_the_right_one_and_reaches_no_pool(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """A POST to a retrieval's path or a GET of a cancellation: 405 naming the method to use,
    recorded; the pool sees neither."""
    before = (len(scripted.gets), len(scripted.received))
    rid = request_id()
    r = httpx.post(f"{sidecar.url}/v1/responses/{RID}", headers={"x-request-id": rid})
    assert r.status_code == 405 and "use GET" in r.json()["error"]["message"]
    assert sidecar.event(rid)["http_status"] == 405
    r = httpx.get(f"{sidecar.url}/v1/responses/{RID}/cancel")
    assert r.status_code == 405 and "use POST" in r.json()["error"]["message"]
    pool_gets = [p for p in scripted.gets[before[0] :] if p.startswith("/v1/responses")]
    assert pool_gets == [] and len(scripted.received) == before[1]


@pytest.mark.parametrize(
    "path",
    ["/v1/responses/", "/v1/responses/a%2F..%2Fb", f"/v1/responses/{RID}/input_items",
     f"/v1/responses/{RID}/cancel/x", "/v1/responses/.x"],
)  # fmt: skip
def test_any_other_path_under_responses_is_the_sidecars_own_404(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, path: str
) -> None:
    """A path that is not a well-formed id (or its cancel) is not relayed: the sidecar's 404."""
    before = len(scripted.gets)
    r = httpx.get(sidecar.url + path)
    assert r.status_code == 404 and "not served by the vllm-obs sidecar" in r.text
    assert [p for p in scripted.gets[before:] if p.startswith("/v1/responses")] == []


@pytest.mark.parametrize(
    "route",
    ["/v1/chat/completions/batch", "/invocations", "/generative_scoring", "/v2/rerank",
     "/v2/embed", "/cohere/v2/chat"],
)  # fmt: skip
def test_vllms_other_serving_routes_reach_the_pool_as_sent(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar, route: str
) -> None:
    """vLLM's batch chat, SageMaker, scoring and Cohere routes are relayed (the body as it
    came) with an event under their own route (before: the sidecar's 404)."""
    rid = request_id()
    body = b'{"model":"tiny","query":"q","documents":["d"]}'
    r = httpx.post(
        sidecar.url + route, content=body, timeout=10,
        headers={"x-request-id": rid, "content-type": "application/json"},
    )  # fmt: skip
    assert r.status_code == 200
    assert scripted.received[-1] == (route, body)
    assert sidecar.event(rid)["route"] == route
