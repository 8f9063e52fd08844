"""Who sends each request and what its body says: simulated clients and request bodies.

By default every request carries ``X-Client-Class`` (its class) and one identity (the
loadgen's ``--api-key``, if any): the shipped lanes route on the header. To measure how the
sidecar recognises classes without help, ``--no-class-header`` leaves the header out and
``--clients N`` sends each class's sessions as N simulated clients, each with its own opaque
API key (``Authorization: Bearer lgc-...``; only without ``--api-key``, which then stays the
one key of every request). A simulated client sends one request at a time, as an app on one
phone does, so what the sidecar learned from its last stream applies to its next.

Agent requests declare the mix's ``agent.tools`` tool definitions (OpenAI function tools),
as agent frameworks do on every turn of a tool loop, with ``tool_choice: "none"``: the test
engines run without a tool-call parser, and "auto" would need one. The sidecar's rules read
the tools' presence, not the choice.
"""

from __future__ import annotations

import asyncio
from hashlib import blake2b
from typing import Any

from obs.loadgen.mix import Mix, RequestOptions
from obs.loadgen.plan import PlannedRequest

_TOOL_NAMES = ("search", "read_file", "run_query", "fetch_url", "calculator", "send_email")


def tool_definitions(n: int) -> list[dict[str, Any]]:
    """``n`` OpenAI function-tool definitions (names repeat past six)."""
    return [
        {
            "type": "function",
            "function": {
                "name": f"{_TOOL_NAMES[i % len(_TOOL_NAMES)]}_{i}",
                "description": "Look something up for the task at hand.",
                "parameters": {
                    "type": "object",
                    "properties": {"query": {"type": "string"}},
                    "required": ["query"],
                },
            },
        }
        for i in range(n)
    ]


def build_body(
    req: PlannedRequest,
    messages: list[dict[str, str]],
    model: str,
    options: RequestOptions,
    tools: int = 0,
) -> dict[str, Any]:
    """The chat-completions request body (``tools`` definitions on agent requests)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": messages,
        "max_tokens": req.max_tokens,
        "stream": req.stream,
    }
    if req.stream and options.include_usage:
        body["stream_options"] = {"include_usage": True}
    if options.ignore_eos:
        body["ignore_eos"] = True
    if options.temperature is not None:
        body["temperature"] = options.temperature
    if req.client_class == "agent" and tools:
        body["tools"] = tool_definitions(tools)
        body["tool_choice"] = "none"
    return body


class Clients:
    """Each request's headers and simulated client; one request at a time per client."""

    def __init__(
        self, mix: Mix, run_id: str, *, class_header: bool, clients: int, api_key: bool
    ) -> None:
        self._mix = mix
        self._run_id = run_id
        self._class_header = class_header
        self._clients = clients
        self._own_keys = clients > 0 and not api_key
        self._by_session: dict[int, str] = {}
        self._next: dict[str, int] = {}
        self._locks: dict[str, asyncio.Lock] = {}

    def client(self, req: PlannedRequest) -> str | None:
        """The simulated client of the request's session (None without ``--clients``)."""
        if not self._clients:
            return None
        who = self._by_session.get(req.session)
        if who is None:
            k = self._next.get(req.client_class, 0)
            self._next[req.client_class] = k + 1
            seed = f"{self._run_id}/{req.client_class}/{k % self._clients}".encode()
            who = "lgc-" + blake2b(seed, digest_size=8).hexdigest()
            self._by_session[req.session] = who
        return who

    def headers(self, req: PlannedRequest, who: str | None) -> dict[str, str]:
        out = {}
        if self._class_header:
            out["X-Client-Class"] = self._mix.header_value(req.client_class)
        if self._own_keys and who is not None:
            out["Authorization"] = f"Bearer {who}"
        return out

    def turn(self, who: str | None) -> asyncio.Lock:
        """Held while the client's request is in flight (a fresh lock without clients)."""
        if who is None:
            return asyncio.Lock()
        return self._locks.setdefault(who, asyncio.Lock())
