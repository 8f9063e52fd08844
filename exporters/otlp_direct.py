"""One kept-alive ``http.client`` connection for an OTLP endpoint ``requests`` would reach
directly over plain HTTP: the same request, through fewer layers.

A POST through ``requests.Session.send`` costs ~280 µs of CPU for a batch of 85 short
requests' spans (``bench.otlp_post``): the session's hooks, cookies and redirect generator,
the adapter, urllib3's pool, retry and timeout objects and response, and then
``http.client``, which does the socket work. Here ``http.client`` is called directly with
the request ``requests`` prepared (its headers, ``User-Agent`` and netrc credentials
included), on one connection kept alive across POSTs: ~100 µs.

Only for an ``http://`` endpoint that no proxy variable applies to; ``OtlpPost`` sends
everything else (TLS, a proxy) through ``requests`` as before, and hands it an endpoint that
answered with a redirect for good (``Redirected``), since ``requests`` follows it. What
``requests`` does with the answer is done here too: a ``Set-Cookie`` goes into the session's
jar and comes back on the next POSTs, a refusal's text is ``Response.text``'s. A connection
the collector closed while idle is dropped before it is reused, as urllib3's pool does.
"""

from __future__ import annotations

import http.client
import io
from collections.abc import MutableMapping
from typing import Final
from urllib.parse import urlsplit

import requests
import urllib3
from requests.cookies import MockRequest, MockResponse, get_cookie_header
from requests.models import REDIRECT_STATI
from requests.utils import select_proxy
from urllib3.util.wait import wait_for_read

# A lower error -> the ``requests`` exception it would have raised (its name leads the text).
_CONNECT_ERRORS: Final = {TimeoutError: "ConnectTimeout", OSError: "ConnectionError"}
_EXCHANGE_ERRORS: Final = {
    TimeoutError: "ReadTimeout",
    OSError: "ConnectionError",
    http.client.HTTPException: "ConnectionError",
}


class Redirected(Exception):
    """The collector answered with a redirect: ``requests`` is to send it (and follow it)."""


def error_text(e: BaseException, connecting: bool) -> str:
    """How a failed exchange is logged: the ``requests`` exception's name, then the cause."""
    table = _CONNECT_ERRORS if connecting else _EXCHANGE_ERRORS
    name = next(v for k, v in table.items() if isinstance(e, k))
    return f"{name}: {e or type(e).__name__}"


def direct(
    session: requests.Session, request: requests.PreparedRequest, proxies: MutableMapping[str, str]
) -> DirectPost | None:
    """A ``DirectPost`` for ``request``'s endpoint, or None where ``requests`` must send it."""
    url = request.url or ""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname or select_proxy(url, proxies):
        return None
    return DirectPost(session, request, parts.hostname, parts.port or 80)


class DirectPost:
    """POSTs bodies over one kept-alive connection (call it from one thread)."""

    def __init__(
        self, session: requests.Session, request: requests.PreparedRequest, host: str, port: int
    ) -> None:
        self._session = session
        self._request = request
        self._target = request.path_url
        # The prepared headers less the empty body's length: each body sets its own.
        self._headers = [
            (k, v) for k, v in request.headers.items() if k.lower() != "content-length"
        ]
        self._conn = http.client.HTTPConnection(host, port)

    def __call__(self, body: bytes, timeout_s: float) -> tuple[str | None, int]:
        """One POST: (None, status) taken, (the refusal, status), or (the failure, 0)."""
        conn, jar = self._conn, self._session.cookies
        connecting = True
        try:
            if conn.sock is not None and wait_for_read(conn.sock, timeout=0.0):
                conn.close()  # closed by the collector while idle (or unasked-for bytes)
            conn.timeout = timeout_s
            if conn.sock is None:
                conn.connect()
            else:
                conn.sock.settimeout(timeout_s)
            connecting = False
            conn.putrequest("POST", self._target, skip_accept_encoding=True)
            for name, value in self._headers:
                conn.putheader(name, value)
            if jar:
                conn.putheader("Cookie", get_cookie_header(jar, self._request) or "")
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            content = resp.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            return error_text(e, connecting), 0
        if resp.msg.get("set-cookie") or resp.msg.get("set-cookie2"):
            jar.extract_cookies(MockResponse(resp.msg), MockRequest(self._request))  # type: ignore[arg-type]
        if resp.status < 300:
            return None, resp.status
        if resp.status in REDIRECT_STATI and "location" in resp.msg:
            raise Redirected
        try:
            text = self._text(resp, content)
        except requests.RequestException as e:  # a body that does not decode, as requests says
            return f"{type(e).__name__}: {e}", 0
        return f"HTTP {resp.status}: {text[:200]}", resp.status

    def _text(self, resp: http.client.HTTPResponse, content: bytes) -> str:
        """``requests.Response.text`` for this answer (its encoding decoded as urllib3 does)."""
        raw = urllib3.HTTPResponse(
            body=io.BytesIO(content),
            headers=urllib3.HTTPHeaderDict(resp.getheaders()),
            status=resp.status,
            reason=resp.reason,
            preload_content=False,
        )
        adapter = self._session.get_adapter(self._request.url or "")
        return adapter.build_response(self._request, raw).text  # type: ignore[attr-defined]

    def close(self) -> None:
        self._conn.close()
