"""Lane drill-down: where one lane's time goes, its latency distributions, tokens, slow readers."""

from __future__ import annotations

from grafanalib.core import Dashboard

from obs import conventions as c
from obs.config import Config

from . import expr as e
from . import links
from . import variables as v
from .arms import add_arms
from .panels import Grid, Query, dashboard, heatmap, timeseries

UID = links.LANE_UID
LP = e.LP_VARS


def _quantiles(metric: c.Metric, *matchers: str) -> list[Query]:
    sel = e.selector(e.bucket(metric), *LP, *matchers)
    return [Query(e.quantile(q, sel), f"p{q * 100:g}") for q in e.QUANTILES]


def _phases(grid: Grid) -> None:
    grid.row("Phases")
    grid.add(
        timeseries(
            "Mean time per phase (stacked)",
            [Query(e.mean(c.PHASE_DURATION, LP, c.PHASE), "{{phase}}")],
            unit="s",
            description=(
                "Mean seconds per request in each of the five phases (queue, prefill, "
                "first_token, decode, stream); stacked, they add up to the mean end-to-end time."
            ),
            stack=True,
        ),
        12,
        9,
    )
    grid.add(
        timeseries(
            "Phase p95",
            [
                Query(
                    e.quantile(0.95, e.selector(e.bucket(c.PHASE_DURATION), *LP), c.PHASE),
                    "{{phase}}",
                )
            ],
            unit="s",
            description="95th percentile of each phase (quantiles do not add up; see the mean).",
            links=[links.slower_phase_traces("$lane")],
        ),
        12,
        9,
    )


def _latency(grid: Grid) -> None:
    grid.row("Latency distributions")
    for title, metric, what in (
        ("TTFT heatmap", c.TTFT, "Requests per second by time to first token."),
        ("ITL heatmap", c.ITL, "Gaps per second between consecutive output chunks, by size."),
    ):
        grid.add(
            heatmap(
                title,
                Query(e.sum_by(e.rate(e.selector(e.bucket(metric), *LP)), "le"), "{{le}}"),
                unit="s",
                description=what,
            ),
            12,
            9,
        )
    trace = [links.slower_lane_traces("$lane")]
    for title, metric, what in (
        ("TTFT p50 / p95 / p99", c.TTFT, "Time to first token as the client sees it."),
        ("TPOT p50 / p95 / p99", c.TPOT, "Time per output token after the first."),
        ("ITL p50 / p95 / p99", c.ITL, "Gaps between consecutive output chunks from the pool."),
    ):
        grid.add(
            timeseries(
                title,
                _quantiles(metric),
                unit="s",
                description=what,
                links=trace,
                exemplars=metric in c.EXEMPLAR_METRICS,
            ),
            8,
            8,
        )


def _tokens(grid: Grid) -> None:
    grid.row("Tokens and cache")
    grid.add(
        timeseries(
            "Token rates",
            [
                Query(e.sum_by(e.rate(e.selector(e.total(m), *LP))), name)
                for m, name in (
                    (c.PROMPT_TOKENS, "prompt"),
                    (c.CACHED_TOKENS, "cached prompt"),
                    (c.COMPLETION_TOKENS, "completion"),
                )
            ],
            unit="short",
            description="Tokens per second: prompt (as the pool counted), from cache, output.",
        ),
        12,
        8,
    )
    pool_ratio = e.ratio(
        e.sum_by(e.rate(e.selector(e.total(c.POOL_PREFIX_HITS), e.POOL_VAR)), c.POOL),
        e.sum_by(e.rate(e.selector(e.total(c.POOL_PREFIX_QUERIES), e.POOL_VAR)), c.POOL),
    )
    grid.add(
        timeseries(
            "Cache hit ratio",
            [
                Query(
                    e.ratio(
                        e.sum_by(e.rate(e.selector(e.total(c.CACHED_TOKENS), *LP))),
                        e.sum_by(e.rate(e.selector(e.total(c.PROMPT_TOKENS), *LP))),
                    ),
                    "lane: cached / prompt tokens",
                ),
                Query(e.per_lane(pool_ratio), "pool {{pool}}: prefix-cache hits / queries"),
            ],
            unit="percentunit",
            description=(
                "The lane's own share of prompt tokens served from the prefix cache, and the "
                "prefix-cache hit ratio of the pool it routes to (all lanes on that pool)."
            ),
            max_=1,
        ),
        12,
        8,
    )


def _slow_readers(grid: Grid) -> None:
    grid.row("Slow readers")
    stream = e.eq(c.PHASE, "stream")
    grid.add(
        timeseries(
            "Slow-reader lag (stream phase) p50 / p95 / p99",
            _quantiles(c.PHASE_DURATION, stream),
            unit="s",
            description=(
                "Last upstream chunk to last byte handed to the client: how far the client "
                "reads behind the pool."
            ),
        ),
        12,
        8,
    )
    blocked = e.selector(e.hsum(c.STREAM_BLOCKED), *LP)
    grid.add(
        timeseries(
            "Relay blocked on slow clients",
            [
                *_quantiles(c.STREAM_BLOCKED),
                Query(e.sum_by(e.rate(blocked)), "blocked seconds per second"),
            ],
            unit="s",
            description=(
                "Time per streamed request the relay spent blocked writing to the client, and "
                "in total per second (how many streams are stalled on their readers at once)."
            ),
        ),
        12,
        8,
    )


def _outcomes(grid: Grid) -> None:
    grid.row("Outcomes")
    requests = e.selector(e.total(c.REQUESTS), *LP, e.MODEL_VAR)
    grid.add(
        timeseries(
            "Requests by outcome and finish reason",
            [
                Query(
                    e.sum_by(e.rate(requests), c.OUTCOME, c.FINISH_REASON),
                    "{{outcome}} {{finish_reason}}",
                )
            ],
            unit="reqps",
            description="Requests per second by outcome and the pool's finish reason.",
            stack=True,
        ),
        12,
        8,
    )
    grid.add(
        timeseries(
            "Upstream errors by class",
            [
                Query(
                    e.sum_by(e.rate(e.selector(e.total(c.UPSTREAM_ERRORS), *LP)), c.ERROR_CLASS),
                    "{{error_class}}",
                ),
                Query(
                    e.sum_by(e.rate(e.selector(e.total(c.CLIENT_DISCONNECTS), *LP))),
                    "client disconnects",
                ),
            ],
            unit="reqps",
            description="Failures talking to the pool by class, and clients that went away.",
        ),
        12,
        8,
    )


def _json_answers(grid: Grid) -> None:
    """The invalid-JSON indicator; a lane whose clients never ask for JSON shows no series."""
    answers = e.selector(e.total(c.JSON_ANSWERS), *LP, e.MODEL_VAR)
    invalid = e.selector(e.total(c.JSON_ANSWERS), *LP, e.MODEL_VAR, e.eq(c.RESULT, c.JSON_INVALID))
    grid.add(
        timeseries(
            "Invalid JSON answers by model",
            [
                Query(
                    e.ratio(
                        e.sum_by(e.rate(invalid), c.MODEL),
                        e.sum_by(e.rate(answers), c.MODEL) + " > 0",
                    ),
                    "{{model}}",
                )
            ],
            unit="percentunit",
            description=(
                "Of the answers to requests that asked for JSON (response_format json_object / "
                "json_schema, or tools), the share that did not parse, per model (checked as the "
                "answer streams; the text is not kept). No series: no request asked for JSON."
            ),
        ),
        12,
        8,
    )


def build(config: Config) -> Dashboard:
    """The lane drill-down dashboard for ``config`` (one lane at a time)."""
    grid = Grid()
    _phases(grid)
    _latency(grid)
    _tokens(grid)
    _slow_readers(grid)
    _outcomes(grid)
    add_arms(grid)
    _json_answers(grid)
    return dashboard(
        UID,
        "vllm-obs / Lane",
        "One lane: the five phases, latency distributions, tokens, cache hits, slow readers.",
        grid,
        [v.datasource(), v.traces(), v.lane(config, multi=False), v.pool(config), v.model()],
    )
