"""Parsing request bodies without letting one large body stall or swell the relay.

A body under ``OFF_LOOP_BYTES`` is parsed on the event loop (microseconds). A
larger one is first checked for how many JSON values it can hold (commas and
openers, counted at memory speed: an over-estimate, never an under-estimate)
and refused with 413 past ``max_elements`` -- 30 MB of ``{}`` would otherwise
become ten million dicts -- then parsed in a thread, at most ``PARSERS`` at a
time, so a concurrent small request is not delayed by it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from obs.sidecar import errors as e
from obs.sidecar.payloads import parse_json, try_json

OFF_LOOP_BYTES = 256 << 10
MAX_JSON_ELEMENTS = 1_000_000
PARSERS = 2
MAX_MODEL_CHARS = 256  # the event's ``model`` is cut to this (a client chooses it)


class BodyParser:
    """``parse(raw)``: the request's JSON object, on or off the loop by its size."""

    def __init__(self, max_elements: int = MAX_JSON_ELEMENTS) -> None:
        self.max_elements = max_elements
        self._parsers: asyncio.Semaphore | None = None

    async def parse(self, raw: bytes, *, strict: bool) -> dict[str, Any] | None:
        """The body as an object; ``strict``: 400 unless it is one, else None."""
        fn = parse_json if strict else try_json
        if len(raw) < OFF_LOOP_BYTES:
            return fn(raw)
        if self._parsers is None:
            self._parsers = asyncio.Semaphore(PARSERS)
        async with self._parsers:
            return await asyncio.to_thread(self._parse_large, raw, fn)

    def _parse_large(
        self, raw: bytes, fn: Callable[[bytes], dict[str, Any] | None]
    ) -> dict[str, Any] | None:
        values = raw.count(b",") + raw.count(b"{") + raw.count(b"[")
        if values > self.max_elements:
            raise e.PayloadTooLarge(
                f"request body holds more than {self.max_elements} JSON values "
                "(--max-json-elements)"
            )
        return fn(raw)
