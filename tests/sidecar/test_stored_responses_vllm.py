"""The Responses API's stored responses through sidecars in front of a pool of two real
``vllm serve`` replicas (each keeps its own responses: ``VLLM_ENABLE_RESPONSES_API_STORE``):
a follow-up (``previous_response_id``), a retrieval and a cancellation reach the replica that
holds the response, whichever sidecar and replica the client's last request went through."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
import yaml

from obs.engines.server import VllmServer
from tests.conftest import SidecarFactory
from tests.support import event_of

pytestmark = pytest.mark.engine


def _client(base: str, rid: str | None = None) -> openai.OpenAI:
    headers = {"X-Request-Id": rid} if rid else None
    return openai.OpenAI(base_url=base + "/v1", api_key="x", max_retries=0, default_headers=headers)


@pytest.fixture(scope="module")
def replicas(vllm: VllmServer, vllm_b: VllmServer) -> list[str]:
    """The pool's two replicas: the session's two engines that keep their responses."""
    return [vllm.url, vllm_b.url]


@pytest.fixture
def config(tmp_path: Path, replicas: list[str]) -> Path:
    """One pool of both replicas, one lane."""
    path = tmp_path / "lanes.yaml"
    data = {
        "version": 1,
        "pools": [{"name": "p", "replicas": replicas}],
        "lanes": [{"name": "main", "pool": "p", "timeouts": {"first_token_s": 60}}],
        "default_lane": "main",
    }
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def _holder(replicas: list[str], response_id: str) -> str:
    """The replica that holds ``response_id`` (asked directly: exactly one does)."""
    found = [u for u in replicas if httpx.get(f"{u}/v1/responses/{response_id}").status_code == 200]
    assert len(found) == 1, found
    return found[0]


@pytest.fixture
def made(sidecar: SidecarFactory, config: Path, replicas: list[str]) -> Iterator[Any]:
    """Through sidecar A: a long streamed response, unread after its first event, while a
    whole one is made, so the two land on different replicas (fewest outstanding first);
    yields (A, the two ids, the replica of each)."""
    a = sidecar(config=config, traces=False)
    ids: dict[str, str] = {}
    started, whole_made = threading.Event(), threading.Event()

    def streamed() -> None:
        with _client(a.url) as client, client.responses.create(
            model="tiny", input="a long story", max_output_tokens=1200, stream=True,
            extra_body={"ignore_eos": True},
        ) as events:  # fmt: skip
            for event in events:
                if event.type == "response.created":
                    ids["streamed"] = event.response.id
                    started.set()
                    whole_made.wait(60)

    holder = threading.Thread(target=streamed)
    holder.start()
    try:
        assert started.wait(60), "the streamed response never started"
        with _client(a.url) as client:
            ids["whole"] = client.responses.create(model="tiny", input="hi", max_output_tokens=4).id
    finally:
        whole_made.set()
        holder.join(120)
    homes = {kind: _holder(replicas, rid) for kind, rid in ids.items()}
    assert set(homes.values()) == set(replicas), "both replicas must hold one response"
    yield a, ids, homes


def test_a_follow_up_and_a_retrieval_reach_the_replica_that_holds_the_response(
    made: Any, replicas: list[str]
) -> None:
    """Each response, on either replica, is retrieved (200, its own id) and continued with
    ``previous_response_id`` through the sidecar that made it; each request's event names
    that replica (before: the retrieval was the sidecar's 404, and a follow-up went to the
    least loaded replica, which answered 404 for a response it did not hold)."""
    a, ids, homes = made
    for kind, response_id in ids.items():
        for _ in range(2):
            rid = uuid.uuid4().hex
            with _client(a.url, rid) as client:
                got = client.responses.retrieve(response_id)
            assert got.id == response_id
            ev = event_of(a, rid)
            assert (ev["route"], ev["replica"], ev["status"]) == (
                "/v1/responses/{response_id}", homes[kind], "ok",
            )  # fmt: skip
        rid = uuid.uuid4().hex
        with _client(a.url, rid) as client:
            nxt = client.responses.create(
                model="tiny", input="and then?", previous_response_id=response_id,
                max_output_tokens=3,
            )  # fmt: skip
        assert nxt.id != response_id
        assert event_of(a, rid)["replica"] == homes[kind]


def test_another_sidecar_finds_a_response_it_did_not_see_made(
    made: Any, sidecar: SidecarFactory, config: Path
) -> None:
    """A second sidecar (another host's, or this one restarted) looks on each replica in turn:
    both responses are retrieved and continued there (``previous_response_id``); an id no
    replica holds is vLLM's own 404."""
    _, ids, homes = made
    b = sidecar(config=config, traces=False)
    for kind, response_id in ids.items():
        rid = uuid.uuid4().hex
        with _client(b.url, rid) as client:
            assert client.responses.retrieve(response_id).id == response_id
        assert event_of(b, rid)["replica"] == homes[kind]
        rid = uuid.uuid4().hex
        with _client(b.url, rid) as client:
            client.responses.create(
                model="tiny", input="go on", previous_response_id=response_id,
                max_output_tokens=3,
            )  # fmt: skip
        assert event_of(b, rid)["replica"] == homes[kind]
    rid = uuid.uuid4().hex
    with _client(b.url, rid) as client, pytest.raises(openai.NotFoundError, match="resp_nowhere"):
        client.responses.retrieve("resp_nowhere")
    ev = event_of(b, rid)
    assert (ev["http_status"], ev["status"]) == (404, "client_error")


def test_a_cancellation_gets_the_answer_of_the_replica_that_holds_the_response(
    made: Any,
) -> None:
    """Cancelling a finished response through the sidecar answers what its replica answers
    directly (vLLM: 400, a synchronous response cannot be cancelled), not a 404."""
    a, ids, homes = made
    response_id = ids["whole"]
    direct = httpx.post(f"{homes['whole']}/v1/responses/{response_id}/cancel")
    relayed = httpx.post(f"{a.url}/v1/responses/{response_id}/cancel")
    assert relayed.status_code == direct.status_code != 404
    assert relayed.json()["error"]["message"] == direct.json()["error"]["message"]
