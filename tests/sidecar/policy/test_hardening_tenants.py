"""Fair share against a client that names a new tenant on every request (issue 25, item 6).

The bound itself (``obs.sidecar.policy.auth``) is pure and tested directly, with its clock
injected. The scenario runs a real sidecar; its pool is ``ScriptedUpstream``, holding
each of the attacker's requests half a second, because the test needs slots held for a
known time, which a real engine's generation time does not give on a loaded machine.
"""

from __future__ import annotations

import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import yaml
from hypothesis import given
from hypothesis import strategies as st

from obs import conventions as c
from obs.config_blocks import ApiKey, Auth
from obs.sidecar.policy.auth import TENANT_WINDOW_S, Tenants
from tests.conftest import SidecarFactory
from tests.support import chat_body
from tests.support.lanes_support import lane_gauge, rejections
from tests.support.scripted_upstream import Script, ScriptedUpstream

ATTACKS = 40
HOLD_S = 0.5  # the pool holds each attack's slot this long


@given(st.lists(st.tuples(st.sampled_from(["a", "b"]), st.text(max_size=3)), max_size=60))
def test_one_address_brings_at_most_the_bound_of_tenants(ops: list[tuple[str, str]]) -> None:
    """Per address, at most 3 distinct tenants keep their own key; the rest share one."""
    tenants = Tenants(Auth(tenant_header="x-tenant"), 3, clock=lambda: 0.0)
    own: dict[str, set[str]] = {"a": set(), "b": set()}
    for addr, tenant in ops:
        key = tenants.share_key(tenant, addr)
        if key == tenant:
            own[addr].add(tenant)
        else:
            assert key == f"client {addr}"
            assert len(own[addr]) == 3
        assert len(own[addr]) <= 3


def test_a_tenant_unseen_for_the_window_frees_its_place() -> None:
    """After TENANT_WINDOW_S without a request, an address's old tenant no longer counts."""
    now = [0.0]
    tenants = Tenants(Auth(tenant_header="x-tenant"), 1, clock=lambda: now[0])
    assert tenants.share_key("t1", "a") == "t1"
    assert tenants.share_key("t2", "a") == "client a"
    now[0] = TENANT_WINDOW_S + 1
    assert tenants.share_key("t2", "a") == "t2"


def test_keys_the_sidecar_checked_are_never_bounded() -> None:
    """With ``auth.api_keys`` the tenant is the key's: fair share uses it as it is."""
    auth = Auth(api_keys=[ApiKey(sha256="ab" * 32, tenant="t")])
    tenants = Tenants(auth, 1)
    assert [tenants.share_key(t, "a") for t in ("t", "u", "v")] == ["t", "u", "v"]


def test_rotating_tenants_from_one_address_cannot_fill_the_victims_lane(
    sidecar: SidecarFactory, tmp_path: Path
) -> None:
    """40 requests from 127.0.0.2, each naming a new tenant, fill neither the queue nor the
    lane: a victim tenant from 127.0.0.3 is queued and served (unbounded: 429 queue_full)."""
    with ScriptedUpstream() as pool:
        config = {
            "version": 1,
            "auth": {"tenant_header": "x-tenant"},
            "pools": [{"name": "p", "replicas": [pool.url]}],
            "lanes": [{"name": "a", "pool": "p", "admission": {
                "max_concurrency": 2, "max_queue": 12, "queue_timeout_s": 60,
                "tenant_fair_share": True}}],
            "default_lane": "a",
        }  # fmt: skip
        path = tmp_path / "lanes.yaml"
        path.write_text(yaml.safe_dump(config), encoding="utf-8")
        sc = sidecar(config=path, traces=False)
        attacker = httpx.Client(
            base_url=sc.url, timeout=120, transport=httpx.HTTPTransport(local_address="127.0.0.2")
        )

        def attack(i: int) -> int:
            rid = f"attack-{i}-{uuid.uuid4().hex[:8]}"
            pool.scripts[rid] = Script(end_delay_s=HOLD_S)
            headers = {"x-tenant": f"rotating-{i}", "x-request-id": rid}
            return attacker.post(
                "/v1/chat/completions", json=chat_body(), headers=headers
            ).status_code

        with ThreadPoolExecutor(ATTACKS) as ex:
            attacks = [ex.submit(attack, i) for i in range(ATTACKS)]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # every attack refused, waiting or served
                refused = sum(rejections(sc).values())
                waiting = lane_gauge(sc, c.QUEUED.name, "a") + lane_gauge(sc, c.IN_FLIGHT.name, "a")
                served = sum(f.done() and f.result() == 200 for f in attacks)
                if refused + waiting + served >= ATTACKS:
                    break
                time.sleep(0.05)
            with httpx.Client(
                base_url=sc.url, timeout=120,
                transport=httpx.HTTPTransport(local_address="127.0.0.3"),
            ) as victim:  # fmt: skip
                r = victim.post(
                    "/v1/chat/completions", json=chat_body(), headers={"x-tenant": "victim"}
                )
            statuses = [f.result() for f in attacks]
        attacker.close()
    assert r.status_code == 200, r.text
    assert statuses.count(200) < ATTACKS
    assert rejections(sc)[("a", c.TENANT_SHARE)] >= 1
