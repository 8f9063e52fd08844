"""Lane rules and recognition settings of the lanes config (``obs.config`` reads them).

``Match`` is one classification rule (obs.lanes matches it against a request's attributes);
``Recognition`` says how the sidecar recognises requests beyond their header: the recent
prefixes it remembers and the slow readers it learns (obs.sidecar.policy.recognition).
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

PositiveInt = Annotated[int, Field(gt=0)]
PositiveFloat = Annotated[float, Field(gt=0)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Match(_Model):
    """One classification rule; every given attribute must match (AND)."""

    route: str | None = None
    model: str | None = None
    stream: bool | None = None
    tenant: str | None = None
    header: dict[str, str] | None = None
    min_prompt_tokens: PositiveInt | None = None
    max_prompt_tokens: PositiveInt | None = None
    min_max_tokens: PositiveInt | None = None
    max_max_tokens: PositiveInt | None = None
    # What the request's shape says (obs.lanes.prompt_shape; docs/lanes.md "Recognition"):
    # tools declared, or tool calls / tool results in the messages (agent loops).
    tools: bool | None = None
    # Where most of the prompt's text sits: "earlier" (the system message or earlier turns,
    # as retrieval-augmented requests put a document before a short question) or "last"
    # (the last message: one long user message).
    context_in: Literal["earlier", "last"] | None = None
    # The prompt's leading text (its prefix fingerprint) was seen from a recent request.
    prefix_seen: bool | None = None
    min_n: PositiveInt | None = None  # choices asked for (``n``)
    # ``response_format.type`` (text when absent): text, json_object, json_schema, ...
    response_format: list[str] | None = None
    # The client was learned to read its streams slowly (``recognition`` below).
    slow_reader: bool | None = None


class Recognition(_Model):
    """How the sidecar recognises requests beyond their header: prefixes and slow readers."""

    # What identifies a client for slow-reader learning: its API key (the Authorization
    # header, hashed), its tenant, or its address. Without a key or tenant: its address.
    client_id: Literal["api_key", "tenant", "address"] = "api_key"
    # A stream is read slowly when the client took this long past the pool's last token
    # (stream phase) or had the relay blocked this long on its buffer.
    slow_stream_ms: PositiveFloat = 1000.0
    # Fast streams in a row that make a learned slow reader forgotten (one fast stream may
    # only mean the pool was slower than the client that time).
    fast_streams_to_forget: PositiveInt = 2
    max_clients: PositiveInt = 10_000  # clients remembered (least recently seen forgotten)
    max_prefixes: PositiveInt = 4096  # prefix fingerprints remembered for prefix_seen
