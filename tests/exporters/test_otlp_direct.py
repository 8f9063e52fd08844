"""The OTLP POST straight through ``http.client`` (``otlp_direct``): what ``requests`` did is
still done, against a real receiver on loopback."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from obs.exporters.otlp_direct import direct
from obs.exporters.otlp_http import OtlpPost, OtlpSettings
from obs.exporters.otlp_proto import export_request
from obs.procs import free_port
from obs.sidecar.testing import OtlpReceiver
from tests.support.faults_support import wait_until

pytestmark = pytest.mark.inproc

BODY = export_request({"service.name": "direct"}, [])


@pytest.fixture
def receiver() -> Iterator[OtlpReceiver]:
    r = OtlpReceiver().start()
    yield r
    r.stop()


def _post(url: str, **kw: object) -> OtlpPost:
    return OtlpPost(OtlpSettings(endpoint=url, **kw), "otel", lambda: False)  # type: ignore[arg-type]


def test_only_a_plain_http_endpoint_without_a_proxy_goes_direct(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``https://`` and an endpoint a proxy variable applies to stay with ``requests``."""
    for name in ("http_proxy", "HTTP_PROXY", "no_proxy", "NO_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    session = requests.Session()

    def goes_direct(url: str, proxies: dict[str, str]) -> bool:
        request = session.prepare_request(requests.Request("POST", url, data=b""))
        return direct(session, request, proxies) is not None

    assert goes_direct("http://127.0.0.1:4318/v1/traces", {})
    assert not goes_direct("https://127.0.0.1:4318/v1/traces", {})
    assert not goes_direct("http://127.0.0.1:4318/v1/traces", {"http": "http://proxy:3128"})
    assert not goes_direct("http://127.0.0.1:4318/v1/traces", {"all": "http://proxy:3128"})


def test_a_connection_the_collector_closed_while_idle_is_not_reused(
    receiver: OtlpReceiver,
) -> None:
    """A collector that closes each connection after answering (an idle timeout) loses no POST,
    each in one attempt: the next opens a new connection instead of writing into the closed one."""
    receiver.close_each = True
    session = requests.Session()
    fast = direct(session, session.prepare_request(requests.Request("POST", receiver.url)), {})
    assert fast is not None
    for n in range(1, 4):
        assert fast(BODY, 2.0) == (None, 200)
        wait_until(lambda n=n: receiver.closed >= n, 10.0, "the receiver closes the connection")
    fast.close()
    assert receiver.raw == [BODY] * 3


def test_a_redirect_is_followed_as_requests_follows_it(receiver: OtlpReceiver) -> None:
    """A 307 (with a Location) is sent again through ``requests``, which follows it with the
    body: the batch arrives once, and the POSTs after it go the same way."""
    receiver.refuse = [307, 307]
    receiver.location = receiver.url + "?moved"
    post = _post(receiver.url, timeout_s=5.0)
    assert post(BODY) is None
    assert post(BODY) is None
    post.close()
    assert receiver.raw == [BODY, BODY] and receiver.refuse == []


def test_a_refusal_is_reported_with_its_status_and_not_retried(receiver: OtlpReceiver) -> None:
    """A 400 is final (no retry), reported as ``HTTP 400: <body text>``; a 503 is retried."""
    receiver.refuse = [400]
    post = _post(receiver.url, timeout_s=5.0)
    assert post(BODY) == "HTTP 400: "
    assert receiver.raw == []
    receiver.refuse = [503]
    assert post(BODY) is None
    post.close()
    assert receiver.raw == [BODY] and receiver.refuse == []


def test_an_unreachable_collector_fails_as_a_connection_error() -> None:
    """Nothing listening: the failure reads ``ConnectionError: ...``, as through ``requests``."""
    post = _post(f"http://127.0.0.1:{free_port()}/v1/traces", timeout_s=0.3)
    error = post(BODY)
    post.close()
    assert error is not None and error.startswith("ConnectionError: ")
