"""Parsing request bodies without letting one large body stall or swell the relay.

A body under ``OFF_LOOP_BYTES`` is parsed on the event loop (microseconds). A
larger one is first checked for how many JSON values it can hold (commas and
object openers outside strings, ``obs.json_check.ValueCount``: each value but the first
of a container follows a comma, and nesting is bounded; a comma inside a text is text),
counted a ``SLICE`` at a time with the loop free in between, and
refused with 413 past ``max_elements``: 30 MB of ``{}`` would otherwise become
ten million dicts. It is then parsed in a thread, at most ``PARSERS`` at a
time. The parser holds the GIL while it runs, so the element cap, not the
thread, is what bounds how long a concurrent request can wait (200,000 values
parse in about 10 ms).
"""

from __future__ import annotations

import asyncio
from typing import Any

from obs.json_check import ValueCount
from obs.sidecar.outcomes import Refusal, Refused
from obs.sidecar.relay.payloads import try_json
from obs.sidecar.types import Receive

OFF_LOOP_BYTES = 256 << 10
SLICE = 256 << 10  # bytes counted per loop turn
MAX_JSON_ELEMENTS = 200_000
PARSERS = 2
MAX_MODEL_CHARS = 256  # the event's ``model`` is cut to this (a client chooses it)


async def read_body(receive: Receive, max_bytes: int) -> bytes | None:
    """The whole request body; a 413 refusal past ``max_bytes``; None if the client left
    (or the server refused the body: the relay asks its connection which)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        msg = await receive()
        if msg["type"] == "http.disconnect":
            return None
        body = msg.get("body", b"")
        size += len(body)
        if size > max_bytes:
            why = f"request body exceeds the sidecar's limit of {max_bytes} bytes"
            raise Refused(Refusal(413, why))
        chunks.append(body)
        if not msg.get("more_body", False):
            return b"".join(chunks)


class BodyParser:
    """``parse(raw)``: the request's JSON object, on or off the loop by its size."""

    def __init__(self, max_elements: int = MAX_JSON_ELEMENTS) -> None:
        self.max_elements = max_elements
        self._parsers: asyncio.Semaphore | None = None

    async def parse(self, raw: bytes) -> dict[str, Any] | None:
        """The body as an object, or None when it is not one (the pool answers it)."""
        if len(raw) < OFF_LOOP_BYTES:
            return try_json(raw)
        count = ValueCount()
        for at in range(0, len(raw), SLICE):
            if count.feed(raw[at : at + SLICE]) > self.max_elements:
                why = f"request body holds more than {self.max_elements} JSON values"
                raise Refused(Refusal(413, f"{why} (--max-json-elements)"))
            await asyncio.sleep(0)
        if self._parsers is None:
            self._parsers = asyncio.Semaphore(PARSERS)
        async with self._parsers:
            return await asyncio.to_thread(try_json, raw)
