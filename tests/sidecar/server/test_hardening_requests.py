"""Requests an attacker controls: credentials, duplicate headers, huge values (issue 22).

Real sidecar processes. Where the test must see which ``Authorization`` a pool was
sent, the pool is ``RecordingPool`` below: a plain HTTP server that keeps each
request's headers, because no real vLLM reports what credentials it was sent.
Elsewhere the pool is a closed port: the requests never need an answer.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import orjson
import pytest
import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from obs import conventions as c
from obs.procs import free_port
from obs.sidecar.testing import SidecarProcess
from tests.conftest import SidecarFactory
from tests.support.event_log import EventLog
from tests.support.fuzz_support import FAST_EVENTS
from tests.support.probes import HealthProbe, metric, stall_bound_s
from tests.support.rawhttp import exchange, status

CLIENT_KEY = "sk-client-key-for-tests"
POOL_KEY = "sk-pool-key-for-tests"


class RecordingPool:
    """Answers /v1/models and chat with fixed JSON; keeps every request's Authorization."""

    def __init__(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.auth: list[str | None] = []
        pool = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self, body: dict[str, object]) -> None:
                pool.auth.append(self.headers.get("authorization"))
                data = orjson.dumps(body)
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                self._answer({"object": "list", "data": [{"id": "tiny", "object": "model"}]})

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("content-length") or 0))
                self._answer({"choices": [{"finish_reason": "stop"}], "usage": {}})

            def log_message(self, *args: object) -> None:
                return None

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


@pytest.fixture
def pool() -> Iterator[RecordingPool]:
    p = RecordingPool()
    yield p
    p.stop()


def _keyed_config(tmp_path: Path, replica: str) -> Path:
    """Client keys checked by the sidecar; the pool has a key of its own."""
    data = {
        "version": 1,
        "pools": [{"name": "p", "replicas": [replica], "api_key_env": "VLLM_OBS_TEST_POOL_KEY"}],
        "lanes": [{"name": "a", "pool": "p"}],
        "default_lane": "a",
        "auth": {
            "api_keys": [
                {"sha256": hashlib.sha256(CLIENT_KEY.encode()).hexdigest(), "tenant": "team-a"}
            ]
        },
    }
    path = tmp_path / "keyed.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.fixture
def keyed(
    sidecar: SidecarFactory, pool: RecordingPool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> SidecarProcess:
    monkeypatch.setenv("VLLM_OBS_TEST_POOL_KEY", POOL_KEY)  # the sidecar's environment
    return sidecar(
        config=_keyed_config(tmp_path, pool.url),
        args=("--rejected-events-per-s", "5"),
        traces=False,
    )


def test_models_needs_a_client_key_and_sends_the_pools_own(
    keyed: SidecarProcess, pool: RecordingPool
) -> None:
    """/v1/models is 401 without a client key, whatever is guessed; the pool gets its key (6)."""
    for auth in ({}, {"authorization": f"Bearer {POOL_KEY}"}, {"authorization": "Bearer x"}):
        r = httpx.get(keyed.url + "/v1/models", headers=auth)
        assert r.status_code == 401, r.text
    r = httpx.get(keyed.url + "/v1/models", headers={"authorization": f"Bearer {CLIENT_KEY}"})
    assert r.status_code == 200 and r.json()["data"][0]["id"] == "tiny"
    models_auth = [a for a in pool.auth if a is not None]
    assert models_auth and set(models_auth) == {f"Bearer {POOL_KEY}"}


def test_duplicate_authorization_headers_are_refused_in_either_order(
    keyed: SidecarProcess,
) -> None:
    """Wrong-then-valid and valid-then-wrong keys both get 400 (item 9)."""
    body = b'{"model":"tiny","messages":[]}'
    valid, wrong = b"Bearer " + CLIENT_KEY.encode(), b"Bearer wrong"
    for first, second in ((wrong, valid), (valid, wrong)):
        for path in (b"/v1/chat/completions", b"/v1/models"):
            method = b"POST" if b"chat" in path else b"GET"
            raw = (
                method + b" " + path + b" HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
                b"authorization: " + first + b"\r\nauthorization: " + second + b"\r\n"
                b"content-type: application/json\r\ncontent-length: %d\r\n\r\n%b"
                % (len(body), body)
            )
            assert status(exchange(keyed.port, raw)) == 400, (path, first)


def test_refused_requests_are_counted_in_full_but_recorded_at_a_rate(
    keyed: SidecarProcess,
) -> None:
    """300 unauthenticated requests: 300 counted, about 5 a second written one by one, the
    rest in summary records (item 15)."""
    t0 = time.monotonic()
    with httpx.Client(base_url=keyed.url) as client:
        for _ in range(300):
            r = client.post("/v1/chat/completions", json={"model": "tiny", "messages": []})
            assert r.status_code == 401
    elapsed = time.monotonic() - t0
    time.sleep(1.5)  # summaries are written each second, the writer flushes every 0.2 s
    events = keyed.events()
    written = sum(not e["summarized"] for e in events)
    assert 5 <= written <= 5 + 5 * elapsed + 1
    counted = metric(keyed.url, "vllm_obs_requests_total", outcome=c.CLIENT_ERROR)
    assert counted == 300
    assert metric(keyed.url, "vllm_obs_rejected_events_skipped_total") == 300 - written
    assert sum(e["summarized"] or 1 for e in events) == 300


def test_a_huge_model_name_is_capped_in_the_event(sidecar: SidecarFactory) -> None:
    """A 20 MB model name becomes at most 256 characters in the event (item 8)."""
    sc = sidecar(f"http://127.0.0.1:{free_port()}", traces=False)
    body = {"model": "m" * (20 << 20), "messages": [{"role": "user", "content": "hi"}]}
    r = httpx.post(sc.url + "/v1/chat/completions", content=orjson.dumps(body), timeout=60)
    assert r.status_code == 503  # the pool is down; the event is what matters
    (event,) = sc.wait_events(1)
    assert event["model"] == "m" * 256
    assert sc.events_path is not None
    assert max(len(line) for line in sc.events_path.read_bytes().splitlines()) < 8192


def test_a_body_of_millions_of_values_is_refused_off_the_loop(sidecar: SidecarFactory) -> None:
    """10 MB of empty objects is 413 and a concurrent /health is not held for the parse
    (item 4)."""
    sc = sidecar(f"http://127.0.0.1:{free_port()}", traces=False)
    body = b'{"model":"tiny","messages":[' + b",".join([b"{}"] * 3_500_000) + b"]}"
    bound_s = stall_bound_s(lambda: orjson.loads(body))
    with HealthProbe(sc.url) as probe:
        r = httpx.post(
            sc.url + "/v1/chat/completions",
            content=body,
            headers={"content-type": "application/json"},
            timeout=60,
        )
    assert r.status_code == 413
    assert probe.slowest_s < bound_s


_SCALARS = st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(max_size=20)
_JSON = st.recursive(
    _SCALARS | st.floats(allow_nan=False, allow_infinity=False),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=40,
)
_KEYS = st.sampled_from(["model", "messages", "stream", "max_tokens", "prompt"])
_BODIES = st.one_of(
    st.binary(max_size=512),
    _JSON.map(orjson.dumps),
    st.dictionaries(_KEYS, _JSON).map(orjson.dumps),
)


@pytest.fixture(scope="module")
def fuzzed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SidecarProcess]:
    """One sidecar for every example (a closed port as its pool), recording every refusal."""
    work = tmp_path_factory.mktemp("fuzz-bodies")
    sc = SidecarProcess(
        upstream=f"http://127.0.0.1:{free_port()}",
        events=work / "events.jsonl",
        args=("--rejected-events-per-s", "1000000", *FAST_EVENTS),
        env={"OTEL_TRACES_EXPORTER": "none"},
        log_path=work / "sidecar.log",
    ).start()
    yield sc
    sc.stop()


@pytest.mark.process
@settings(max_examples=50, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])  # fmt: skip
@given(body=_BODIES, route=st.sampled_from(["/v1/chat/completions", "/v1/completions",
                                           "/v1/embeddings"]))  # fmt: skip
# Each kind of body and each route at least once, whatever the 50 drawn examples are.
@example(body=b"\x00{\xff\n", route="/v1/embeddings")
@example(body=b'[1, {"a": null}, -1e999]', route="/v1/completions")
@example(body=b'{"model": [], "messages": "x", "stream": 7}', route="/v1/chat/completions")
def test_fuzzed_bodies_get_a_clean_answer_and_exactly_one_event(
    fuzzed: SidecarProcess, body: bytes, route: str
) -> None:
    """Any body on any relayed route: a 4xx or the pool's 503, never a 500; one event each."""
    log = EventLog(fuzzed)
    before = len(log.wait(0, timeout_s=0))
    r = httpx.post(fuzzed.url + route, content=body,
                   headers={"content-type": "application/json"}, timeout=30)  # fmt: skip
    assert r.status_code in (400, 413, 503), r.text
    assert r.json()["error"]["message"]
    assert len(log.wait(before + 1, timeout_s=5)) == before + 1
    assert "relay_internal_error" not in fuzzed.log_tail(200_000)
