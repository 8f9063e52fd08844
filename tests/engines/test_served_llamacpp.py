"""What a real llama-server reports of itself: version and slots from /props, as series."""

from __future__ import annotations

import httpx
import pytest

from obs import conventions as c
from obs.engines.llamacpp_server import LlamaServer
from obs.served import merge, page_settings
from tests.conftest import SidecarFactory
from tests.support import probes

pytestmark = pytest.mark.engine


def test_llamacpp_props_become_the_settings_series(
    llama: LlamaServer, sidecar: SidecarFactory
) -> None:
    """/props gives version, slots and context; the sidecar exports exactly those labels."""
    props = httpx.get(llama.url + "/props", timeout=10).json()
    expected = merge("llamacpp", [page_settings("llamacpp", props)])
    assert {"version", "max_running", "context_tokens"} <= dict(expected.settings).keys()
    sc = sidecar(llama.url, traces=False, args=("--pool-poll-interval", "0.5"))

    def info() -> list[dict[str, str]]:
        return [lb for lb, _ in probes.samples(sc.url).get(c.POOL_SETTINGS_INFO.name, [])]

    got = probes.wait_for("the settings series", info, timeout_s=30)
    assert got == [
        {
            c.POOL: "default",
            c.REPLICA: llama.url,
            c.ENGINE: "llamacpp",
            c.FINGERPRINT: expected.fingerprint,
            **dict(expected.settings),
        }
    ]
