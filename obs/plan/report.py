"""What a plan writes: plan.json, lanes.yaml, the kustomize replica patches, the tables and
an HTML page with the replicas-vs-attainment curve. Generators return plain data; the
writers serialise it."""

from __future__ import annotations

import copy
import html
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from obs.config import Config
from obs.plan.planner import Evaluation, PoolPlan
from obs.plan.traffic import Traffic


@dataclass(frozen=True, slots=True)
class Settings:
    """What the plan was asked, for the record."""

    source: list[str]
    config: str
    growth: float
    window_s: float | None
    margin: float
    margin_source: str
    seed: int


def _round(v: float | None, digits: int = 4) -> float | None:
    return None if v is None else round(v, digits)


def _verdict_row(ev: Evaluation, lane: str) -> dict[str, Any]:
    v = ev.verdicts[lane]
    return {
        "lane": lane,
        "met": v.met,
        "offered": v.offered,
        "rejected": v.rejected,
        "attainment": {k: _round(a) for k, a in v.attainment.items()},
        "objectives": v.objectives,
    }


def pool_row(config: Config, plan: PoolPlan, traffic: Traffic, growth: float) -> dict[str, Any]:
    """One pool's line of the plan: replicas, GPU-hours, cost, headroom, curve."""
    price = config.pool(plan.pool.name).price
    gpus = price.gpus_per_replica if price else 1
    row: dict[str, Any] = {
        "name": plan.pool.name,
        "gpu": plan.pool.gpu,
        "model": plan.pool.model,
        "replicas": plan.replicas,
        "gpu_hours_per_day": None if plan.replicas is None else plan.replicas * gpus * 24,
        "cost_per_1k_tokens": None,
        "headroom": None,
        "requests_replayed": plan.requests,
        "replayed_s": plan.replayed_s,
        "curve": [
            {
                "replicas": n,
                "met": ev.met,
                "lanes": {name: _round(v.expected) for name, v in ev.verdicts.items()},
            }
            for n, ev in sorted(plan.curve.items())
        ],
    }
    if plan.at_plan is not None:
        slacks = [v.slack for v in plan.at_plan.verdicts.values() if v.slack is not None]
        row["headroom"] = _round(min(slacks)) if slacks else None
    tokens = traffic.tokens(plan.lanes) * growth
    if price is not None and plan.replicas and tokens and traffic.span_s:
        cost = price.gpu_hour * gpus * plan.replicas * traffic.span_s / 3600
        row["cost_per_1k_tokens"] = round(cost / tokens * 1000, 6)
    return row


def lane_rows(plan: PoolPlan) -> list[dict[str, Any]]:
    """The pool's lanes: their limits and what the replay expects of them at the plan."""
    rows = []
    for lane in plan.lanes:
        limits = plan.limits.get(lane)
        v = plan.at_plan.verdicts.get(lane) if plan.at_plan else None
        rows.append(
            {
                "name": lane,
                "pool": plan.pool.name,
                "max_concurrency": limits.max_concurrency if limits else None,
                "max_queue": limits.max_queue if limits else None,
                "little_in_flight": limits.in_flight if limits else None,
                "peak_rate_per_s": _round(plan.peak_rate.get(lane), 3),
                "mean_service_s": _round(plan.service_s.get(lane), 3),
                "expected_attainment": _round(v.expected) if v else None,
                "attainment": {k: _round(a) for k, a in v.attainment.items()} if v else {},
                "goodput_per_s": _round(v.good / plan.replayed_s, 3)
                if v and plan.replayed_s
                else None,
                "met": v.met if v else None,
            }
        )
    return rows


def plan_doc(
    settings: Settings, config: Config, plans: list[PoolPlan], traffic: Traffic
) -> dict[str, Any]:
    """plan.json's data."""
    pools = [pool_row(config, p, traffic, settings.growth) for p in plans]
    lanes = [row for p in plans for row in lane_rows(p)]
    at_plan = [_verdict_row(p.at_plan, lane) for p in plans if p.at_plan for lane in p.lanes]
    one_fewer = []
    for p in plans:
        if p.replicas is None:
            continue
        if p.one_fewer is not None:
            one_fewer.append(
                {
                    "pool": p.pool.name,
                    "replicas": p.one_fewer.replicas,
                    "missing": p.one_fewer.missing,
                    "lanes": [_verdict_row(p.one_fewer, lane) for lane in p.lanes],
                }
            )
        else:  # one replica fewer is none: nothing is served
            served = [
                lane for lane in p.lanes if traffic.lanes.get(lane) and traffic.lanes[lane].offered
            ]
            one_fewer.append({"pool": p.pool.name, "replicas": 0, "missing": served, "lanes": []})
    return {
        "version": 1,
        "settings": {
            "source": settings.source,
            "config": settings.config,
            "growth": settings.growth,
            "window_s": settings.window_s,
            "margin": settings.margin,
            "margin_source": settings.margin_source,
            "seed": settings.seed,
        },
        "traffic": {
            "events": traffic.events,
            "span_s": traffic.span_s,
            "interval_s": traffic.bin_s,
            "shapes_sampled": traffic.sampled,
            "offered": {name: lt.offered for name, lt in traffic.lanes.items()},
        },
        "pools": pools,
        "lanes": lanes,
        "check": {
            "met": all(r["met"] for r in at_plan) and all(p.replicas for p in plans),
            "at_plan": at_plan,
            "one_fewer": one_fewer,
        },
    }


def lanes_yaml(data: dict[str, Any], plans: list[PoolPlan]) -> dict[str, Any]:
    """The lanes config ``data`` (as loaded YAML) with each planned lane's limits set."""
    limits = {lane: lim for p in plans for lane, lim in p.limits.items()}
    out = copy.deepcopy(data)
    lanes = out.get("lanes")
    items = lanes.values() if isinstance(lanes, dict) else lanes or []
    for lane in items:
        lim = limits.get(lane.get("name"))
        if lim is None:
            continue
        admission = dict(lane.get("admission") or {})
        admission.pop("token_budget", None)
        admission["max_concurrency"] = lim.max_concurrency
        admission["max_queue"] = lim.max_queue
        lane["admission"] = admission
    return out


def replica_patch(pool: str, replicas: int) -> str:
    """A strategic-merge patch for the pool's overlay in deploy/k8s (``nameSuffix`` adds the
    pool to the Deployment's name there)."""
    return (
        f"# vllm-obs plan: pool {pool} at {replicas} replica{'s' * (replicas != 1)}.\n"
        f"# Add to deploy/k8s/overlays/{pool}/kustomization.yaml: patches: - path: replicas.yaml\n"
        + yaml.safe_dump(
            {
                "apiVersion": "apps/v1",
                "kind": "Deployment",
                "metadata": {"name": "vllm"},
                "spec": {"replicas": replicas},
            },
            sort_keys=False,
        )
    )


def text(doc: dict[str, Any]) -> str:
    """The tables the command prints."""
    lines = []
    s = doc["settings"]
    lines.append(
        f"Plan for growth x{s['growth']:g} (margin {s['margin']:.1%}: {s['margin_source']})"
    )
    lines.append("")
    header = ["pool", "gpu", "replicas", "GPU-h/day", "cost/1k tok", "headroom", "replayed"]
    body = []
    for p in doc["pools"]:
        body.append(
            [
                p["name"],
                f"{p['gpu']} {p['model']}",
                "-" if p["replicas"] is None else str(p["replicas"]),
                "-" if p["gpu_hours_per_day"] is None else f"{p['gpu_hours_per_day']:g}",
                "-" if p["cost_per_1k_tokens"] is None else f"${p['cost_per_1k_tokens']:.5f}",
                "-" if p["headroom"] is None else f"{p['headroom'] * 100:+.1f} pts",
                f"{p['requests_replayed']} req / {p['replayed_s']:g} s",
            ]
        )
    lines += _table(header, body)
    lines.append("")
    header = ["lane", "pool", "max_conc", "max_queue", "attainment", "goodput/s", "met"]
    body = []
    for r in doc["lanes"]:
        att = r["expected_attainment"]
        body.append(
            [
                r["name"],
                r["pool"],
                str(r["max_concurrency"] or "-"),
                str(r["max_queue"] if r["max_queue"] is not None else "-"),
                "-" if att is None else f"{att:.2%}",
                "-" if r["goodput_per_s"] is None else f"{r['goodput_per_s']:g}",
                {True: "yes", False: "NO", None: "-"}[r["met"]],
            ]
        )
    lines += _table(header, body)
    lines.append("")
    for f in doc["check"]["one_fewer"]:
        missing = ", ".join(f["missing"]) or "none"
        lines.append(f"one replica fewer ({f['pool']} x{f['replicas']}): misses {missing}")
    return "\n".join(lines) + "\n"


def _table(header: list[str], body: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in [header, *body]) for i in range(len(header))]
    return [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in [header, *body]
    ]


W, H, PAD = 520, 300, 40
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2")


def curve_svg(pool: dict[str, Any]) -> str:
    """One pool's curve: per lane, its binding SLO's attainment against replicas (no limits)."""
    curve = pool["curve"]
    xs = [c["replicas"] for c in curve]
    x0 = min(xs)
    x1 = max(xs) if max(xs) > x0 else x0 + 1
    lows = [v for c in curve for v in c["lanes"].values() if v is not None]
    y0 = min([*lows, 0.9])
    yspan = (1 - y0) or 1.0

    def px(x: float, y: float) -> tuple[float, float]:
        return (
            round(PAD + (x - x0) / (x1 - x0) * (W - 2 * PAD), 1),
            round(H - PAD - (y - y0) / yspan * (H - 2 * PAD), 1),
        )

    svg = [f"<svg width='{W}' height='{H}' xmlns='http://www.w3.org/2000/svg'>"]
    for i, lane in enumerate(sorted({k for c in curve for k in c["lanes"]})):
        pts = [px(c["replicas"], v) for c in curve if (v := c["lanes"].get(lane)) is not None]
        color = COLORS[i % len(COLORS)]
        points = " ".join(f"{x},{y}" for x, y in pts)
        svg.append(f"<polyline fill='none' stroke='{color}' points='{points}'/>")
        svg.append(
            f"<text x='{W - PAD - 90}' y='{PAD + 14 * i}' fill='{color}' font-size='11'>"
            f"{html.escape(lane)}</text>"
        )
    for x in xs:
        svg.append(f"<text x='{px(x, y0)[0]}' y='{H - PAD + 14}' font-size='11'>{x}</text>")
    svg.append(f"<text x='4' y='{PAD}' font-size='11'>1.0</text>")
    svg.append(f"<text x='4' y='{H - PAD}' font-size='11'>{y0:.2f}</text>")
    if pool["replicas"]:
        svg.append(
            f"<text x='{PAD}' y='{PAD - 10}' font-size='12'>plan: {pool['replicas']} replicas"
            "</text>"
        )
    svg.append("</svg>")
    return "".join(svg)


def html_page(doc: dict[str, Any]) -> str:
    """The tables and, per pool, its replicas-vs-attainment curve."""
    parts = [
        "<!doctype html><meta charset='utf-8'><title>vllm-obs plan</title>",
        "<style>body{font-family:sans-serif;margin:2em}svg{border:1px solid #ccc}</style>",
        "<h1>vllm-obs plan</h1>",
        f"<pre>{html.escape(text(doc))}</pre>",
    ]
    for pool in doc["pools"]:
        if pool["curve"]:
            parts.append(f"<h2>pool {html.escape(pool['name'])}: replicas vs attainment</h2>")
            parts.append(curve_svg(pool))
    return "\n".join(parts) + "\n"


def write(out: Path, doc: dict[str, Any], lanes: dict[str, Any], header: str) -> list[Path]:
    """Write plan.json, lanes.yaml, report.html and k8s/<pool>/replicas.yaml under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "plan.json", out / "lanes.yaml", out / "report.html"]
    written[0].write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
    written[1].write_text(header + yaml.safe_dump(lanes, sort_keys=False), encoding="utf-8")
    written[2].write_text(html_page(doc), encoding="utf-8")
    for p in doc["pools"]:
        if p["replicas"]:
            path = out / "k8s" / p["name"] / "replicas.yaml"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(replica_patch(p["name"], p["replicas"]), encoding="utf-8")
            written.append(path)
    return written
