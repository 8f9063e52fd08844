"""Reading what each replica runs: its version and settings, on a bounded schedule.

Settings on the ``/metrics`` page (vLLM's ``cache_config_info``) are read with every
poll, from the page already fetched. The engine's JSON page (``obs.served.SETTINGS_PAGES``:
vLLM ``/version``, llama.cpp ``/props``, TGI ``/info``, SGLang ``/get_server_info``) is
fetched on the first poll a replica answers, again on the first poll after it was down
(a restart is when settings change), and otherwise every ``PAGE_EVERY_POLLS`` polls. A
page that does not answer keeps the values read before: a version never flaps to absent
because one request failed.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Final

import aiohttp
import orjson
import structlog

from obs.engines import UNKNOWN
from obs.served import SETTINGS_PAGES, Change, ChangeTracker, merge, page_settings
from obs.sidecar.engine_scrape import page_settings as metrics_settings

if TYPE_CHECKING:
    from obs.sidecar.pools import Replica

log = structlog.get_logger("vllm_obs.served")

PAGE_EVERY_POLLS: Final = 12  # ~1 minute at the default 5 s poll
MAX_PAGE_BYTES: Final = 256 * 1024


class SettingsPoll:
    """Each replica's :class:`~obs.served.Served`, and the changes between them."""

    def __init__(self) -> None:
        self.tracker = ChangeTracker()
        self._pages: dict[str, dict[str, object]] = {}  # replica url -> its JSON page's settings
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
            page = await self._fetch(session, r.url, engine, limit)
            if page is not None:
                self._pages[r.url] = page_settings(engine, page)
            self._due[r.url] = PAGE_EVERY_POLLS
        else:
            self._due[r.url] = due - 1
        r.served = merge(engine, (metrics_settings(engine, text), self._pages.get(r.url, {})))
        change = self.tracker.observe((r.pool, r.url), r.served, time.time())
        if change is not None:
            log.info("replica_settings_changed", replica=r.url, old=change.old, new=change.new)
        return change

    def went_down(self, r: Replica) -> None:
        """The replica stopped answering: read its page on the first poll it answers again."""
        self._due[r.url] = 0

    async def _fetch(
        self, session: aiohttp.ClientSession, url: str, engine: str, limit: aiohttp.ClientTimeout
    ) -> Any:
        if engine not in SETTINGS_PAGES:
            return None
        try:
            async with session.get(url + SETTINGS_PAGES[engine][0], timeout=limit) as resp:
                if resp.status != 200:
                    return None
                body = await resp.content.read(MAX_PAGE_BYTES + 1)
                if len(body) > MAX_PAGE_BYTES:
                    return None
                return orjson.loads(body)
        except (aiohttp.ClientError, OSError, TimeoutError, ValueError):
            return None
