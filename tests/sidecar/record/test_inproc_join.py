"""The engine join in process: a traced pool's record waits for the engine's span, which the
join learned to expect at the record's start, and goes on joined through the steps after it.

The pool is ``ScriptedUpstream`` (a fake, in this process) and the span is posted as vLLM
would post it, under the ``traceparent`` the pool was sent: the join with a real vLLM's own
spans is tests/engines/test_engine_view.py (engine tier).
"""

from __future__ import annotations

import httpx
import pytest

from obs.config import parse_config
from obs.sidecar.testing import llm_request_under
from tests.sidecar.conftest import InprocFactory
from tests.support import chat_body
from tests.support.inproc import InProcessSidecar, request_id
from tests.support.probes import CHAT
from tests.support.scripted_upstream import Script, ScriptedUpstream

ANSWER = b'{"choices":[{"index":0,"message":{"content":"hi"}}]}'


@pytest.fixture(scope="module")
def sidecar(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    """An in-process sidecar whose one pool sends engine spans; records wait 5 s for one."""
    config = parse_config(
        {
            "pools": [{"name": "main", "replicas": [scripted.url], "engine_traces": True}],
            "lanes": [{"name": "main", "pool": "main"}],
            "default_lane": "main",
        },
        "<inproc>",
    )
    return inproc(config, engine_join_wait_s=5.0)


def test_a_traced_pools_record_is_joined_with_its_engine_span(
    scripted: ScriptedUpstream, sidecar: InProcessSidecar
) -> None:
    """The record is held until the span naming the sidecar's span arrives, then written once,
    the engine view joined (the ids were issued at the record's start: ``on_start``)."""
    rid = request_id()
    scripted.scripts[rid] = Script(content_type="application/json", pieces=[ANSWER])
    r = sidecar.client.post(CHAT, json=chat_body(rid), headers={"x-request-id": rid})
    assert r.status_code == 200
    assert sidecar.memory.records(rid) == []  # held for its span
    _, trace, span, _ = scripted.traceparents[rid].split("-")
    export = llm_request_under(
        bytes.fromhex(trace), bytes.fromhex(span), **{"gen_ai.latency.time_in_queue": 0.012}
    )
    headers = {"content-type": "application/x-protobuf"}
    assert (
        httpx.post(sidecar.url + "/v1/traces", content=export, headers=headers).status_code == 200
    )
    ev = sidecar.event(rid)
    assert (ev["engine_view"], ev["engine_queue_ms"]) == ("joined", pytest.approx(12.0))
    assert ev["span_id"] == span
    assert len(sidecar.memory.records(rid)) == 1
