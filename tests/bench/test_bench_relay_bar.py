"""Issue 45's relay bar from one session's rows: each relay's four figures and the verdicts
against the router measured in the same rounds."""

from __future__ import annotations

from bench import relay_bar, report
from bench.vllm_bench import RunResult


def _run(round_: int, requests: int, tokens: int, cpu_s: float | None, ttft_ms: float, dur: float):
    res = RunResult(
        duration_s=dur,
        completed=requests,
        failed=0,
        output_tokens=tokens,
        ttfts_ms=[ttft_ms],
        itls_ms=[5.0],
        errors=[],
        relayed_requests=requests,
        relayed_tokens=tokens,
    )
    return report.Run(round_, res, cpu_s, 10.0)


def _session(per_req: dict[str, float], ttft: dict[str, float], dur: dict[str, float]):
    """Rows of one session: direct plus each relay at the four levels, CPU = requests x
    per_req + tokens x 10 us."""
    rows = []
    for level, n, tok in (
        ("c1", 50, 80),
        ("c64", 1000, 80),
        ("short", 1000, 2),
        ("long", 400, 160),
    ):
        by_target = {}
        for target in ("direct", *per_req):
            cpu = None if target == "direct" else n * per_req[target] + n * tok * 10e-6
            by_target[target] = [
                _run(1, n, n * tok, cpu, ttft.get(target, 2.0), dur.get(target, 10.0))
            ]
        rows += report.rows(level, by_target)
    return rows


def test_figures_and_verdicts_against_the_router() -> None:
    """A sidecar at 1.2x the router's CPU per request, the same per token, a smaller added
    TTFT and 99.5% of direct's throughput meets all four; one at 1.5x, a larger added TTFT
    and 98% meets only the per-token figure."""
    rows = _session(
        {"sidecar": 0.36e-3, "vllm-router": 0.30e-3, "slow": 0.45e-3},
        {"sidecar": 2.3, "vllm-router": 2.5, "slow": 3.0},
        {"sidecar": 10.05, "slow": 10.2},
    )
    figs = relay_bar.figures(rows)
    router = figs["vllm-router"]
    assert abs(figs["sidecar"].token_us - 10.0) < 1e-6  # type: ignore[operator]
    assert abs(figs["sidecar"].request_ms - 0.36) < 1e-6  # type: ignore[operator]
    assert relay_bar.verdicts(figs["sidecar"], router) == {
        "cpu_per_short_request": True,
        "cpu_per_token": True,
        "c1_added_ttft": True,
        "c64_share": True,
    }
    assert relay_bar.verdicts(figs["slow"], router) == {
        "cpu_per_short_request": False,
        "cpu_per_token": True,
        "c1_added_ttft": False,
        "c64_share": False,
    }
    table = relay_bar.table({"fake, 0 ms": figs})
    assert "| fake, 0 ms | slow |" in table and "NOT met / met / NOT met / NOT met" in table


def test_no_router_no_verdict() -> None:
    """Without the router in the session the relative figures are not judged (None)."""
    figs = relay_bar.figures(_session({"sidecar": 0.36e-3}, {}, {}))
    v = relay_bar.verdicts(figs["sidecar"], None)
    assert v["cpu_per_short_request"] is None and v["c1_added_ttft"] is None
