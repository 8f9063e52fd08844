"""Token budgets a client cannot game (issue 63): no negative or absurd cap is charged, a
request without a cap is charged the context left, and every generating route's prompt and
output fields are read into the estimate.

The in-process sidecar with a tenant's tokens-per-minute limit and a lane prompt cap; the pool
is ``ScriptedUpstream``, which reports the usage a test needs (a real engine cannot be made to
generate a set number of tokens). The rule's pure part is pinned on ``limits_for``.
"""

from __future__ import annotations

import json
import threading
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from typing import Any

import pytest

from obs import conventions as c
from obs.config import Config, parse_config
from obs.sidecar.policy.rate_limit import ABSENT_CONTEXT, TOKENS, limits_for
from obs.sidecar.policy.recognition import prompt_tokens
from tests.sidecar.conftest import InprocFactory
from tests.support.inproc import InProcessSidecar, request_id
from tests.support.probes import sample_sum
from tests.support.scripted_upstream import Script, ScriptedUpstream, token_frame, usage_frame

LIMIT = 1000
PROMPT_CAP = 100
CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


def _config(url: str, **more: Any) -> Config:
    return parse_config(
        {
            "pools": [{"name": "p", "replicas": [url]}],
            "lanes": [{"name": "main", "pool": "p",
                       "admission": {"max_prompt_tokens": PROMPT_CAP}}],
            "default_lane": "main",
            "auth": {"tenant_header": "x-tenant"},
            "tenants": {"acme": {"tokens_per_minute": LIMIT}},
            **more,
        }
    )  # fmt: skip


@pytest.fixture
def budgeted(scripted: ScriptedUpstream, inproc: InprocFactory) -> InProcessSidecar:
    return inproc(_config(scripted.url))


def _send(sc: InProcessSidecar, scripted: ScriptedUpstream, route: str, body: dict[str, Any],
          used: int = 2) -> tuple[int, str]:  # fmt: skip
    """One request of tenant acme whose pool reports ``used`` output tokens; (status, id)."""
    rid = request_id()
    scripted.scripts[rid] = Script(pieces=[token_frame("a"), usage_frame(8, used)])
    r = sc.client.post(route, json=body, headers={"x-request-id": rid, "x-tenant": "acme"})
    return r.status_code, rid


def _used(sc: InProcessSidecar) -> float:
    return sample_sum(sc.samples(), c.RATE_LIMIT_USED.series[0], tenant="acme", kind="tokens")


@pytest.mark.inproc
def test_a_negative_max_tokens_is_refused_before_any_charge(
    budgeted: InProcessSidecar, scripted: ScriptedUpstream
) -> None:
    """``max_tokens: -2147483647`` is a 400 naming the field, from the sidecar (no pool
    asked); nothing is banked: a request asking the whole limit then fits once, the next is
    429 (before: the negative cost left 2,147,483,660 tokens for the minute)."""
    code, rid = _send(budgeted, scripted, "/v1/chat/completions",
                      CHAT | {"max_tokens": -2147483647})  # fmt: skip
    ev = budgeted.event(rid)
    assert code == 400 and "max_tokens" in ev["error_message"] and ev["replica"] is None
    zero, _ = _send(budgeted, scripted, "/v1/chat/completions", CHAT | {"max_tokens": 0})
    whole = LIMIT - 20  # with the prompt's estimate, within the limit
    first, _ = _send(budgeted, scripted, "/v1/chat/completions", CHAT | {"max_tokens": whole},
                     used=whole)  # fmt: skip
    second, _ = _send(budgeted, scripted, "/v1/chat/completions", CHAT | {"max_tokens": whole})
    assert (zero, first, second) == (400, 200, 429)


@pytest.mark.inproc
def test_a_request_without_max_tokens_is_charged_the_context_left(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """Requests without ``max_tokens`` that each use 600 tokens: the first is admitted, the
    second refused, and the minute's use stays within the limit (before: charged their prompt
    only, the second was admitted too and the minute used 1,220 of 1,000)."""
    sc = inproc(_config(scripted.url))
    codes = [_send(sc, scripted, "/v1/chat/completions", CHAT, used=600)[0] for _ in range(3)]
    assert codes == [200, 429, 429]
    assert _used(sc) <= LIMIT


@pytest.mark.inproc
@pytest.mark.parametrize(
    ("route", "body"),
    [
        ("/v1/responses", {"model": "m", "input": "word " * 2000}),
        ("/v1/responses", {"model": "m", "input": "hi", "instructions": "word " * 2000}),
        ("/v1/messages", {"model": "m", "max_tokens": 4, "system": "word " * 2000,
                          "messages": [{"role": "user", "content": "hi"}]}),
        ("/v1/chat/completions/batch",
         {"model": "m", "messages": [[{"role": "user", "content": "word " * 2000}]]}),
        ("/generative_scoring", {"model": "m", "query": "word " * 2000, "items": ["a"]}),
        ("/v2/embed", {"model": "m", "texts": ["word " * 2000]}),
    ],
)  # fmt: skip
def test_long_prompts_on_every_route_meet_the_lane_prompt_cap(
    budgeted: InProcessSidecar, scripted: ScriptedUpstream, route: str, body: dict[str, Any]
) -> None:
    """A 10,000-character prompt in a field the chat estimate does not read is refused by a
    100-token lane cap (413 prompt_too_long; before: relayed, charged about 1 token)."""
    code, rid = _send(budgeted, scripted, route, body)
    assert code == 413
    assert budgeted.event(rid)["rejection_reason"] == c.PROMPT_TOO_LONG


@pytest.mark.inproc
def test_max_output_tokens_is_the_responses_cap(
    budgeted: InProcessSidecar, scripted: ScriptedUpstream
) -> None:
    """The Responses API's ``max_output_tokens`` is its cap: a negative one is a 400 naming
    it, one past the minute's limit a 429 (before: read as no cap, charged nothing)."""
    body = {"model": "m", "input": "hi"}
    neg, rid = _send(budgeted, scripted, "/v1/responses", body | {"max_output_tokens": -5})
    assert neg == 400 and "max_output_tokens" in budgeted.event(rid)["error_message"]
    big, rid = _send(budgeted, scripted, "/v1/responses", body | {"max_output_tokens": 5 * LIMIT})
    assert big == 429 and budgeted.event(rid)["max_tokens"] == 5 * LIMIT


def test_costs_are_never_negative_and_an_absent_cap_fits_the_limit() -> None:
    """``limits_for``: a negative cap or prompt costs nothing below zero; an absent cap costs
    the context left (the declared ``max_model_len`` minus the prompt, else
    ``ABSENT_CONTEXT``), at most the whole limit."""
    config = _config("http://127.0.0.1:9")
    (neg,) = limits_for(config, "acme", None, -50, -2147483647)
    assert neg.kind == TOKENS and neg.cost == 0
    (absent,) = limits_for(config, "acme", None, 30, None)
    assert absent.cost == LIMIT  # 30 + ABSENT_CONTEXT - 30, cut to the limit
    declared = parse_config(
        {
            "pools": [{"name": "p", "replicas": ["http://127.0.0.1:9"],
                       "engine": {"max_model_len": 512}}],
            "lanes": [{"name": "main", "pool": "p"}],
            "default_lane": "main",
            "tenants": {"acme": {"tokens_per_minute": LIMIT}},
        }
    )  # fmt: skip
    (ctx,) = limits_for(declared, "acme", None, 30, None)
    assert ctx.cost == 512 and ABSENT_CONTEXT > LIMIT


def test_whole_body_routes_estimate_every_field() -> None:
    """On the Responses API the estimate reads ``instructions`` too; on a chat it is the
    messages' estimate as before."""
    body = {"model": "m", "input": "hi", "instructions": "x" * 4000}
    assert prompt_tokens("/v1/responses", body, 1) >= 1000
    assert prompt_tokens("/v1/chat/completions", body, 1) == 1


@pytest.mark.inproc
@pytest.mark.parametrize(
    "tenant_headers",
    [[("x-tenant", "free"), ("x-tenant", "acme")], [("x-tenant", "acme, gold")]],
)
def test_one_tenant_header_names_one_tenant(
    budgeted: InProcessSidecar, tenant_headers: list[tuple[str, str]]
) -> None:
    """A repeated ``X-Tenant``, or one a gateway appended to, is a 400 naming the header
    (before: ``acme, gold`` was a tenant of its own that no limit named: unlimited)."""
    rid = request_id()
    headers = [("x-request-id", rid), ("content-type", "application/json"), *tenant_headers]
    body = json.dumps(CHAT | {"max_tokens": 4})
    r = budgeted.client.post("/v1/chat/completions", content=body, headers=headers)
    assert r.status_code == 400 and "x-tenant" in r.json()["error"]["message"]


@pytest.mark.inproc
def test_30_concurrent_requests_without_max_tokens_stay_within_the_limit(
    scripted: ScriptedUpstream, inproc: InprocFactory
) -> None:
    """30 concurrent streams without ``max_tokens``, each using 600 tokens, the pool holding
    them: those admitted use at most 1.5x the minute's limit (before: all 30 admitted, charged
    their prompts only, 18x the limit)."""
    sc = inproc(_config(scripted.url))
    hold = threading.Event()

    def one() -> int:
        rid = request_id()
        scripted.scripts[rid] = Script(pieces=[token_frame("a"), usage_frame(8, 600)], hold=hold)
        headers = {"x-request-id": rid, "x-tenant": "acme"}
        body = CHAT | {"stream": True}
        r = sc.client.post("/v1/chat/completions", json=body, headers=headers, timeout=60)
        return r.status_code

    with ThreadPoolExecutor(30) as pool:
        futures = [pool.submit(one) for _ in range(30)]
        wait(futures, timeout=30, return_when=FIRST_COMPLETED)
        for _ in range(300):  # the refused answer at once; the admitted wait for the pool
            if sum(f.done() for f in futures) >= 29:
                break
            wait(futures, timeout=0.1)
        hold.set()
        codes = [f.result() for f in futures]
    assert set(codes) <= {200, 429} and codes.count(200) >= 1
    assert codes.count(200) * 608 <= 1.5 * LIMIT
