"""Reading what each replica runs: its version and settings, on a bounded schedule.

Settings on the ``/metrics`` page (vLLM's ``cache_config_info``) are read with every
poll, from the page already fetched. The engine's JSON page (``obs.served.SETTINGS_PAGES``:
vLLM ``/version``, llama.cpp ``/props``, TGI ``/info``, SGLang ``/get_server_info``) is
fetched on the first poll a replica answers, again on the first poll after it was down
(a restart is when settings change), and otherwise every ``PAGE_EVERY_POLLS`` polls. A
page that does not answer keeps the values read before: a version never flaps to absent
because one request failed. Some engines have a second page only some replicas serve
(``obs.served.EXTRA_PAGES``: vLLM's ``/server_info`` in its dev mode), read on the same
schedule.

The flags a pool declares (``engine: {kind: vllm, max_num_seqs: 64}``) join what its
replicas report; where a replica reports a declared setting too, the two are compared
(``obs.served.drift``) and the result kept per replica for the drift series.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import orjson
import structlog

from obs.engines.adapters import UNKNOWN
from obs.served import (
    EXTRA_PAGES,
    SETTINGS_PAGES,
    Change,
    ChangeTracker,
    drift,
    merge,
    page_settings,
)
from obs.sidecar.pools.engine_scrape import page_settings as metrics_settings

if TYPE_CHECKING:
    from obs.sidecar.pools.pools import Replica

log = structlog.get_logger("vllm_obs.served")

PAGE_EVERY_POLLS: Final = 12  # ~1 minute at the default 5 s poll
MAX_PAGE_BYTES: Final = 256 * 1024
PAGE_TIMEOUT_S: Final = 5.0


class SettingsPoll:
    """Each replica's :class:`~obs.served.Served`, and the changes between them."""

    def __init__(self, declared: Mapping[str, Mapping[str, object]] | None = None) -> None:
        self.tracker = ChangeTracker()
        self.declared = dict(declared or {})  # pool -> the flags it declares
        self.drift: dict[tuple[str, str], dict[str, bool]] = {}  # (pool, url) -> setting -> differs
        self._pages: dict[str, dict[str, object]] = {}  # replica url -> its JSON page's settings
        self._extra: dict[str, dict[str, object]] = {}  # replica url -> its extra page's
        self._due: dict[str, int] = {}  # replica url -> polls until its page is read again

    async def read(
        self, session: aiohttp.ClientSession, r: Replica, text: str, limit: aiohttp.ClientTimeout
    ) -> Change | None:
        """Update ``r.served`` from this poll's ``/metrics`` text (and the JSON page when due)."""
        engine = r.state.engine if r.state is not None else UNKNOWN
        if engine == UNKNOWN:
            return None
        due = self._due.get(r.url, 0)
        if due <= 0:
            # A JSON page may take longer than a poll (vLLM's /server_info: ~3 s the first time).
            slow = aiohttp.ClientTimeout(total=max(limit.total or 0, PAGE_TIMEOUT_S))
            page = await self._fetch(session, r.url, engine, slow)
            if page is not None:
                self._pages[r.url] = page_settings(engine, page)
            extra = await self._fetch(session, r.url, engine, slow, EXTRA_PAGES)
            if extra is not None:
                self._extra[r.url] = page_settings(engine, extra, EXTRA_PAGES)
            self._due[r.url] = PAGE_EVERY_POLLS
        else:
            self._due[r.url] = due - 1
        pages = (self._pages.get(r.url, {}), self._extra.get(r.url, {}))
        reported = merge(engine, (metrics_settings(engine, text), *pages))
        declared = self.declared.get(r.pool, {})
        self.drift[(r.pool, r.url)] = drift(dict(reported.settings), declared)
        r.served = merge(engine, (dict(reported.settings), declared))
        change = self.tracker.observe((r.pool, r.url), r.served, time.time())
        if change is not None:
            log.info("replica_settings_changed", replica=r.url, old=change.old, new=change.new)
        return change

    def went_down(self, r: Replica) -> None:
        """The replica stopped answering: read its page on the first poll it answers again."""
        self._due[r.url] = 0
        self.drift.pop((r.pool, r.url), None)

    async def _fetch(
        self,
        session: aiohttp.ClientSession,
        url: str,
        engine: str,
        limit: aiohttp.ClientTimeout,
        pages: Mapping[str, tuple[str, Any]] = SETTINGS_PAGES,
    ) -> Any:
        if engine not in pages:
            return None
        try:
            async with session.get(url + pages[engine][0], timeout=limit) as resp:
                if resp.status != 200:
                    return None
                body = await resp.content.read(MAX_PAGE_BYTES + 1)
                if len(body) > MAX_PAGE_BYTES:
                    return None
                return orjson.loads(body)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None
