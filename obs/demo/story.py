"""The demo's story: load sized to the pools' probed capacity, a scripted incident in the
middle, and the closing summary that says what happened.

* **Probe.** Before the load, ``PROBE_STREAMS`` chat-sized streams go straight to the
  interactive pool (not through the sidecar: no events) for ``PROBE_S`` seconds; the
  requests it completes per second at that concurrency are its capacity. The mix's sessions
  cost more than one such request (agent turns, RAG documents, batch summaries): the rate is
  ``LOAD_SHARE`` of the capacity over the mix's output tokens per session against the
  probe's per request.
* **Incident.** From ``INCIDENT_AT`` of the run, ``BURST`` long RAG prompts (documents of
  ~``BURST_PROMPT_TOKENS`` tokens that no request sent before, a short question after them,
  no class header) go through the sidecar at once: its rules put them in lane ``rag``, on the
  interactive pool that chat shares, whose steps then prefill them while chat waits.
* **Summary.** ``vllm-obs query incident`` over the run, cut to two or three lines.

HTTP through ``requests`` in threads: the demo's orchestration is synchronous.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import requests

from obs.demo import results
from obs.demo.options import LOCAL_POOLS, SIM_POOLS
from obs.query import incident

PROBE_STREAMS = 16
PROBE_S = 6.0
PROBE_MAX_TOKENS = 64
INCIDENT_AT = 0.4  # of the load's duration
BURST = 24
BURST_PROMPT_TOKENS = 1400
BURST_MAX_TOKENS = 16
TIMEOUT_S = 120.0


@dataclass(frozen=True, slots=True)
class Capacity:
    """What the probe measured: requests completed per second at ``streams`` at once."""

    requests_per_s: float
    tokens_per_request: float
    streams: int

    def rate(self, share: float, tokens_per_session: float) -> float:
        """Sessions per second that fill ``share`` of the capacity."""
        per_session = max(1.0, tokens_per_session / max(1.0, self.tokens_per_request))
        return max(0.1, round(share * self.requests_per_s / per_session, 2))


def model_of(url: str) -> str:
    """The first model ``url``'s ``/v1/models`` lists."""
    r = requests.get(f"{url}/v1/models", timeout=10)
    r.raise_for_status()
    return str(r.json()["data"][0]["id"])


def _stream(url: str, body: dict[str, Any], headers: Mapping[str, str] | None = None) -> int:
    """POST a streamed chat request and read it to the end; the output chunks read."""
    with requests.post(
        f"{url}/v1/chat/completions",
        json=body | {"stream": True},
        headers=dict(headers or {}),
        stream=True,
        timeout=TIMEOUT_S,
    ) as r:
        r.raise_for_status()
        return sum(1 for line in r.iter_lines() if line.startswith(b"data: {"))


def probe(pool_url: str, model: str) -> Capacity:
    """Drive ``PROBE_STREAMS`` chat streams at the pool for ``PROBE_S`` seconds."""
    stop = time.monotonic() + PROBE_S
    done: list[int] = []
    lock = threading.Lock()

    def client(k: int) -> None:
        i = 0
        while time.monotonic() < stop:
            body = {
                "model": model,
                "messages": [{"role": "user", "content": f"probe {k} {i}: say something"}],
                "max_tokens": PROBE_MAX_TOKENS,
                "ignore_eos": True,
            }
            n = _stream(pool_url, body)
            with lock:
                done.append(n)
            i += 1

    started = time.monotonic()
    with ThreadPoolExecutor(PROBE_STREAMS) as pool:
        list(pool.map(client, range(PROBE_STREAMS)))
    elapsed = time.monotonic() - started
    per_request = sum(done) / len(done) if done else float(PROBE_MAX_TOKENS)
    return Capacity(len(done) / elapsed, per_request, PROBE_STREAMS)


def tokens_per_session(mix: Any) -> float:
    """Mean output tokens the mix asks for per session (an agent conversation is several
    requests), from its classes' weights and ranges."""
    total = weight = 0.0
    for name in ("chat", "rag", "long_prefill", "agent", "batch", "slow_stream"):
        spec = getattr(mix.classes, name, None)
        if spec is None or not spec.weight:
            continue
        lo, hi = spec.max_tokens
        turns = getattr(spec, "turns", None)
        n = (turns[0] + turns[1]) / 2 if turns else 1.0
        total += spec.weight * n * (lo + hi) / 2
        weight += spec.weight
    return total / weight if weight else float(PROBE_MAX_TOKENS)


@dataclass(slots=True)
class Burst:
    """The scripted incident: ``n`` long RAG prompts sent at once, ``at_s`` into the load."""

    url: str
    model: str
    at_s: float
    n: int = BURST
    started_at: datetime | None = None
    errors: int = 0
    _thread: threading.Thread | None = None
    _cancelled: threading.Event = field(default_factory=threading.Event)

    def start(self, notice: Callable[[str], None]) -> None:
        """Arm the burst: it fires from its own thread ``at_s`` from now, unless cancelled."""

        def fire() -> None:
            if self._cancelled.wait(self.at_s):
                return
            self.started_at = datetime.now(UTC)
            notice(
                f"incident: {self.n} long RAG prompts (~{BURST_PROMPT_TOKENS} tokens each) "
                "into the interactive pool that chat shares"
            )
            with ThreadPoolExecutor(self.n) as pool:
                for ok in pool.map(self._one, range(self.n)):
                    self.errors += not ok

        self._thread = threading.Thread(target=fire, name="demo-incident", daemon=True)
        self._thread.start()

    def _one(self, i: int) -> bool:
        from obs.loadgen.prompts import words  # the demo mix's vocabulary: its token sizes

        tag = uuid.uuid4().hex[:8]
        text = words(f"incident/{tag}/{i}", 4 * BURST_PROMPT_TOKENS)
        body = {
            "model": self.model,
            "messages": [
                {"role": "system", "content": f"Document {tag}-{i}: {text}"},
                {"role": "user", "content": "Summarise the document in one line."},
            ],
            "max_tokens": BURST_MAX_TOKENS,
        }
        try:
            _stream(self.url, body, {"X-Request-Id": f"incident-{tag}-{i}"})
        except requests.RequestException:
            return False
        return True

    def cancel(self) -> None:
        """The load stopped: a burst not yet sent never is (one already sent still finishes)."""
        self._cancelled.set()

    def join(self, timeout_s: float = TIMEOUT_S) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)


def closing(
    doc: Mapping[str, Any], events: Sequence[Mapping[str, Any]], burst: Burst | None
) -> str:
    """A few lines, each within ``incident.WIDTH`` columns: when the burst hit, the incident
    as ``query incident`` tells it (trigger, the victims ranked by harm with the share of
    their wait the trigger was ahead, the mechanism and the lever), and the figures that say
    how much of the run the engine's view and the causes cover."""
    lines = []
    if burst is not None and burst.started_at is not None:
        lines.append(
            f"At {burst.started_at.isoformat(timespec='seconds')} a burst of {burst.n} long "
            "RAG prompts hit the interactive pool."
        )
    stories = list(doc.get("incidents") or [])
    stories.sort(key=incident.harm_done, reverse=True)  # the most harm done to other lanes
    if stories:
        day = str(doc.get("since") or stories[0]["start"])[:10]
        lines += incident.story_lines(stories[0], day)
    elif doc.get("slos"):
        s = doc["slos"][0]
        lines.append(
            f"Lane {s['lane']} missed its {s['slo']} SLO on {s['misses']} of {s['judged']} "
            f"requests: {s['cause_share']:.0%} {s['phase']}/{s['cause']}."
        )
    else:
        lines.append("No lane missed an SLO.")
    done = [e for e in events if e.get("status") == "ok"]
    viewed = sum(1 for e in done if e.get("engine_view") in ("joined", "inferred"))
    missed = [e for e in events if e.get("miss_cause")]
    other = sum(1 for e in missed if e["miss_cause"] == "other")
    lines.append(
        f"Engine view on {viewed / max(1, len(done)):.0%} of {len(done)} completed requests; "
        f"{other / max(1, len(missed)):.0%} of {len(missed)} misses unexplained (other)."
    )
    return "\n".join(lines)


def engine_blocks(engine: str) -> dict[str, dict[str, object]]:
    """Each local pool's lanes.yaml ``engine:`` block: vLLM's declared flags (from which its
    serve line is generated), or the simulated pool's ``max_num_seqs``."""
    if engine != "sim":
        return {spec.name: spec.engine_block() for spec in LOCAL_POOLS}
    out: dict[str, dict[str, object]] = {}
    for spec in LOCAL_POOLS:
        args = SIM_POOLS[spec.name]
        block: dict[str, object] = {"kind": "sim"}
        if "--max-num-seqs" in args:
            block["max_num_seqs"] = int(args[args.index("--max-num-seqs") + 1])
        out[spec.name] = block
    return out


def sized_rate(url: str, model: str, mix: Any, share: float, say: Callable[[str], None]) -> float:
    """``share`` of the pool at ``url``'s probed capacity, in the mix's sessions per second."""
    say(f"[probe] {PROBE_STREAMS} chat streams straight to {url} for {PROBE_S:g} s (no events) ...")
    cap = probe(url, model)
    per_session = tokens_per_session(mix)
    rate = cap.rate(share, per_session)
    say(
        f"[probe] capacity {cap.requests_per_s:.1f} requests/s of {cap.tokens_per_request:.0f} "
        f"tokens at {cap.streams} streams; the mix asks ~{per_session:.0f} tokens per session: "
        f"{share:.0%} of it is {rate:g} sessions/s"
    )
    return rate


def closing_of(out: Path, burst: Burst | None, say: Callable[[str], None]) -> str:
    """The closing summary of the run in ``out``, from ``vllm-obs query incident`` over its
    events (the whole draft written to ``incident.txt``); empty when the query failed."""
    args = ["query", "incident", "events.jsonl", "--config", "lanes.yaml", "--no-progress"]
    try:
        draft = results.vllm_obs(args, cwd=out)
        doc = json.loads(results.vllm_obs([*args, "--format", "json"], cwd=out))
    except (results.CommandError, ValueError) as e:
        say(f"[report] query incident failed: {e}")
        return ""
    (out / "incident.txt").write_text(draft, encoding="utf-8")
    lines = (out / "events.jsonl").read_text(encoding="utf-8").splitlines()
    return closing(doc, [json.loads(line) for line in lines if line.strip()], burst)
