"""What the relay remembers to recognise requests: recent prefixes and slow-reading clients.

Two bounded LRU maps, touched once per request on the event loop (no locks):

- ``RecentPrefixes``: hashes of the first ``PREFIX_CHARS`` characters (about 1,000 tokens)
  of recent requests' text (``leading_key``). A request whose hash is in it has
  ``prefix_seen`` (a shared document, a conversation resent with one more turn). The span is
  longer than a shared system prompt usually is, so one alone does not make every request
  "seen"; a short prompt has no key at all. A prefix is remembered only once its request
  was admitted (``remember``): refused requests cannot flush a victim's document out.
- ``SlowReaders``: clients (by API key, tenant or address: ``recognition.client_id``) who
  read a stream slowly: its stream phase (to the last byte their side acknowledged, on any
  connection kind, one connection per request included) or the relay's wait on them passed
  ``slow_stream_ms``, or they had not taken it all when the record stopped waiting
  (``client_unread_bytes``). Their next requests have ``slow_reader`` until they read
  ``fast_streams_to_forget`` streams in a row fast again (one fast stream may only mean the
  pool was slower than the client that time). Keys are hashed: no API key is held in memory.
  A key is read as its scheme (any case) and token (spaces trimmed), so a slow reader cannot
  escape by respelling ``Bearer``; a tenant the sidecar did not check against a key (a
  header's) counts together with the address that sent it, so nobody can name a victim's
  tenant to mark it slow.

Both are sized by the config's ``recognition`` section; the least recently seen entry goes
first. The number of learned clients is a gauge (``vllm_obs_slow_readers``), and each
lane decision is counted by its source (``vllm_obs_classified_total``).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from hashlib import blake2b
from typing import Any

from prometheus_client import CollectorRegistry, Counter
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from obs import conventions as c
from obs import openai_api
from obs.events import Event
from obs.lanes import CHARS_PER_TOKEN, Classifier, RequestAttrs, prompt_shape, response_format
from obs.lanes import _json_chars as json_chars
from obs.matching import Recognition

PREFIX_CHARS = 4096


def leading_key(body: Mapping[str, Any], chars: int = PREFIX_CHARS) -> str | None:
    """A hash of the first ``chars`` characters of the request's text (messages' contents
    run together, or a string prompt); None when it has fewer."""
    parts: list[str] = []
    n = 0
    msgs = openai_api.messages(body)
    texts = (
        (t for m in msgs for t in openai_api.content_texts(m.get("content")))
        if msgs is not None
        else iter(openai_api.prompt_strings(body) or [])
    )
    for t in texts:
        parts.append(t)
        n += len(t)
        if n >= chars:
            text = "".join(parts)[:chars]
            return blake2b(text.encode("utf-8", "replace"), digest_size=8).hexdigest()
    return None


class RecentPrefixes:
    """The last ``size`` prefix fingerprints seen."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._seen: OrderedDict[str, None] = OrderedDict()

    def has(self, fp: str | None) -> bool:
        """Whether ``fp`` was remembered recently (remembers nothing)."""
        return fp is not None and fp in self._seen

    def remember(self, fp: str | None) -> None:
        """Keep ``fp`` as the most recent."""
        self.seen(fp)

    def seen(self, fp: str | None) -> bool:
        """Whether ``fp`` was seen recently; remembers it either way."""
        if fp is None:
            return False
        d = self._seen
        if fp in d:
            d.move_to_end(fp)
            return True
        d[fp] = None
        if len(d) > self.size:
            d.popitem(last=False)
        return False


def client_id(
    how: str,
    headers: Mapping[str, str],
    tenant: str | None,
    client: Any,
    tenant_checked: bool = True,
) -> str | None:
    """The client's identity for learning (``recognition.client_id``), or None when unknown.

    ``api_key``: a hash of the ``Authorization`` header's scheme (lower case) and token
    (trimmed); ``tenant``: the resolved tenant, with the address when the tenant was not
    checked against a key (``tenant_checked``); either falls back to the client's address
    (``scope["client"]``) when absent.
    """
    addr = client[0] if isinstance(client, list | tuple) and client else None
    addr = addr if isinstance(addr, str) else None
    if how == "api_key" and headers.get("authorization", "").strip():
        scheme, _, token = headers["authorization"].strip().partition(" ")
        key = f"{scheme.lower()} {token.strip()}".encode("latin-1", "replace")
        return "k:" + blake2b(key, digest_size=12).hexdigest()
    if how == "tenant" and tenant:
        return "t:" + tenant if tenant_checked or addr is None else f"t:{tenant}|a:{addr}"
    return None if addr is None else "a:" + addr


class SlowReaders(Collector):
    """Clients learned to read slowly, least recently seen forgotten first; each with the
    number of fast streams it has read since its last slow one."""

    def __init__(self, settings: Recognition) -> None:
        self.settings = settings
        self._slow: OrderedDict[str, int] = OrderedDict()

    def __contains__(self, who: str | None) -> bool:
        return who is not None and who in self._slow

    def __len__(self) -> int:
        return len(self._slow)

    def observe(self, who: str | None, ev: Event) -> None:
        """Learn from a finished stream: slow (past ``slow_stream_ms``) or fast again."""
        if who is None or not ev.stream or ev.status != c.OK:
            return
        slow = (
            max(ev.stream_ms, ev.stream_blocked_ms) >= self.settings.slow_stream_ms
            or (ev.client_unread_bytes or 0) > 0  # not all read when the record stopped waiting
        )
        d = self._slow
        if not slow:
            if who in d:
                d[who] += 1
                if d[who] >= self.settings.fast_streams_to_forget:
                    del d[who]
            return
        d[who] = 0
        d.move_to_end(who)
        if len(d) > self.settings.max_clients:
            d.popitem(last=False)

    def collect(self) -> Iterator[Metric]:
        m = c.SLOW_READERS
        g = GaugeMetricFamily(m.name, m.help)
        g.add_metric([], len(self._slow))
        yield g


# Routes whose prompt sits in fields the chat/completion estimate does not read (the Responses
# API's ``input`` and ``instructions``, the Messages API's ``system``, a batch's conversations,
# Cohere's ``texts``, generative scoring's query and items): their estimate is the whole
# body's JSON characters, so a lane's prompt cap and a rate limit see what the engine reads.
WHOLE_BODY_ROUTES = frozenset({"/v1/responses", "/v1/messages", "/v1/chat/completions/batch",
                               "/generative_scoring", "/v2/embed"})  # fmt: skip


def prompt_tokens(route: str, body: Mapping[str, Any], shape_tokens: int) -> int:
    """The prompt's estimate on ``route``: the messages' (``shape_tokens``), or on
    ``WHOLE_BODY_ROUTES`` the whole body's, whichever is larger."""
    if route not in WHOLE_BODY_ROUTES:
        return shape_tokens
    return max(shape_tokens, json_chars(body) // CHARS_PER_TOKEN)


class Recognizer:
    """The relay's memory for recognition, and the counter of its decisions."""

    def __init__(
        self,
        settings: Recognition,
        registry: CollectorRegistry | None = None,
        tenants_checked: bool = False,
    ) -> None:
        self.settings = settings
        self.tenants_checked = tenants_checked  # every tenant comes from a key the sidecar checks
        self.needs_shape = True  # prompt size or shape: a rule or a gate reads it (the relay says)
        self.prefixes = RecentPrefixes(settings.max_prefixes)
        self.slow = SlowReaders(settings)
        m = c.CLASSIFIED
        self.decisions = Counter(m.name, m.help, m.labels, registry=registry)
        self._children: dict[tuple[str, str], Any] = {}
        if registry is not None:
            registry.register(self.slow)

    def client(self, headers: Mapping[str, str], tenant: str | None, client: Any) -> str | None:
        return client_id(self.settings.client_id, headers, tenant, client, self.tenants_checked)

    def decided(self, lane: str, source: str) -> None:
        child = self._children.get((lane, source))
        if child is None:  # labels() costs a few microseconds: looked up once per pair
            child = self._children[lane, source] = self.decisions.labels(lane, source)
        child.inc()

    def attrs(
        self,
        cl: Classifier,
        ev: Event,
        headers: dict[str, str],
        body: dict[str, Any] | None,
        scope: Mapping[str, Any],
    ) -> tuple[RequestAttrs, str | None, str | None]:
        """The attributes the lane rules read (each computed only when a rule or a gate needs
        it), the client's identity and the prompt's leading key (to ``prefixes.remember`` once
        admitted), from the event's model, stream and max_tokens as the relay read them
        (``obs.sidecar.relay.payloads.read_fields``)."""
        b = body or {}
        key = leading_key(b) if cl.needs_prefix and body is not None else None
        shape = prompt_shape(body) if self.needs_shape and body is not None else None
        n = b.get("n")
        who = self.client(headers, ev.tenant, scope.get("client"))
        attrs = RequestAttrs(
            route=ev.route,
            model=ev.model,
            stream=ev.stream,
            headers=headers,
            tenant=ev.tenant,
            max_tokens=ev.max_tokens,
            prompt_tokens=prompt_tokens(ev.route, b, shape.tokens) if shape else None,
            tools=shape.tools if shape else False,
            context_in=shape.context_in if shape else "last",
            prefix_seen=self.prefixes.has(key),
            n=n if isinstance(n, int) and not isinstance(n, bool) else 1,
            response_format=response_format(b),
            slow_reader=cl.needs_slow_reader and who in self.slow,
        )
        return attrs, who, key
