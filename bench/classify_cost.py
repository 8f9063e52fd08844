"""CPU per request of recognising a request's class, before and after request recognition.

In process, on already-parsed bodies shaped like the default mix's six classes (sizes from
``loadgen/default_mix.yaml``; agent turns with four tool definitions): what the relay did per
request before (prompt-size estimate + the shipped rules) against what it does now (the rule
attributes: shape, recent-prefix LRU, learned slow reader, response format; the lane with its
class_source; the decision counter; learning from the finished stream). The JSON parse is
not included: the relay parsed every body before as well. ``bench.relay`` prints the figure.

    .venv/bin/python -m bench.classify_cost --out bench/results/classify_cost.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from obs.config import default_config_path, load_config
from obs.events import Event
from obs.lanes import Classifier, RequestAttrs, estimate_prompt_tokens
from obs.loadgen.clients import tool_definitions
from obs.loadgen.prompts import words
from obs.sidecar.policy.recognition import Recognizer
from obs.sidecar.relay.bodies import MAX_MODEL_CHARS
from obs.sidecar.relay.payloads import read_fields

BUDGET_US = 50.0


def _text(key: str, tokens: int) -> str:
    return words(key, tokens * 4)[: tokens * 4]


def bodies(variant: int) -> dict[str, dict[str, Any]]:
    """One request body per class, text keyed on ``variant`` (so prefixes differ)."""
    v = str(variant)
    user = [{"role": "user", "content": _text(v + "chat", 300)}]
    history = []
    for t in range(4):
        history += [
            {"role": "user", "content": _text(f"{v}turn{t}", 250)},
            {"role": "assistant", "content": _text(f"{v}answer{t}", 100)},
        ]
    return {
        "chat": {"messages": user, "stream": True, "max_tokens": 160},
        "rag": {
            "messages": [
                {"role": "system", "content": _text(f"doc{variant % 8}", 2200)},
                {"role": "user", "content": _text(v + "q", 40)},
            ],
            "stream": True,
        },
        "long-prefill": {
            "messages": [{"role": "user", "content": _text(v + "lp", 6000)}],
            "stream": True,
        },
        "agent": {
            "messages": [{"role": "system", "content": _text(v + "ctx", 1500)}, *history],
            "tools": tool_definitions(4),
            "stream": True,
        },
        "batch": {"messages": [{"role": "user", "content": _text(v + "b", 3000)}], "stream": False},
        "slow-stream": {"messages": user, "stream": True, "max_tokens": 320},
    }


def _per_call_us(fn: Callable[[], None], n: int, repeats: int) -> float:
    """The fastest of ``repeats`` means over ``n`` calls, in µs (the least disturbed run)."""
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter_ns() - t0) / n / 1000)
    return best


def measure(n: int = 400, repeats: int = 5) -> dict[str, Any]:
    config = load_config(default_config_path())
    cl = Classifier(config)
    rec = Recognizer(config.recognition, CollectorRegistry())
    headers = {"authorization": "Bearer sk-client", "content-type": "application/json"}
    scope = {"client": ("10.0.0.7", 40000)}
    done = Event(stream=True, stream_ms=3.0)
    variants = [bodies(i) for i in range(16)]
    out: dict[str, Any] = {}
    for name in variants[0]:
        cycle = itertools.cycle([v[name] for v in variants])

        def before(cycle: Iterator[dict[str, Any]] = cycle) -> None:
            b = next(cycle)
            pt = estimate_prompt_tokens(b)
            cl.classify(_plain(b, headers, pt))

        def after(cycle: Iterator[dict[str, Any]] = cycle) -> None:
            b = next(cycle)
            ev = Event(route="/v1/chat/completions")
            read = read_fields(ev.route, b, MAX_MODEL_CHARS)
            ev.model, ev.stream, ev.max_tokens = read.model, read.stream, read.max_tokens
            attrs, who, key = rec.attrs(cl, ev, headers, b, scope)
            rec.prefixes.remember(key)  # as the relay does once admitted
            lane, ev.class_source = cl.decide(attrs)
            rec.decided(lane.name, ev.class_source)
            rec.slow.observe(who, done)

        b_us, a_us = _per_call_us(before, n, repeats), _per_call_us(after, n, repeats)
        out[name] = {
            "before_us": round(b_us, 2),
            "after_us": round(a_us, 2),
            "added_us": round(a_us - b_us, 2),
        }
    added = [v["added_us"] for v in out.values()]
    return {
        "per_class": out,
        "added_us_median": round(statistics.median(added), 2),
        "added_us_max": round(max(added), 2),
        "budget_us": BUDGET_US,
    }


def _plain(body: dict[str, Any], headers: dict[str, str], pt: int) -> RequestAttrs:
    return RequestAttrs(
        route="/v1/chat/completions",
        model=None,
        stream=body.get("stream") is True,
        headers=headers,
        tenant=None,
        max_tokens=body.get("max_tokens"),
        prompt_tokens=pt,
    )


def summary_line(result: dict[str, Any]) -> str:
    return (
        f"classification (bench.classify_cost): +{result['added_us_median']:g} µs CPU per "
        f"request (median over the six classes; worst {result['added_us_max']:g} µs; budget "
        f"{result['budget_us']:g} µs)"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write the figures (JSON) here")
    args = p.parse_args(argv)
    result = measure()
    for name, v in result["per_class"].items():
        print(f"{name:13} before {v['before_us']:7.2f} µs  after {v['after_us']:7.2f} µs")
    print(summary_line(result))
    if args.out is not None:
        result["command"] = "python -m bench.classify_cost " + " ".join(argv or sys.argv[1:])
        args.out.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0 if result["added_us_max"] < BUDGET_US else 1


if __name__ == "__main__":
    raise SystemExit(main())
