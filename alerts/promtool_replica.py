"""promtool cases for ``replica_rules`` and ``gpu_fault_rules``: each alert fires past its
bound (pending first where it holds) and is silent inside it: one replica ten times slower
than its pool's other (fires) or twice (silent); an XID error, a double-bit ECC error, a GPU
throttled half the time by its thermal or power limit against none."""

from __future__ import annotations

from typing import Any

from obs import conventions as c

from . import timeline as tl
from .gpu_fault_rules import THROTTLES
from .model import AlertModel
from .promtool_gpu import GPU_KEY, GPU_LABELS
from .promtool_health import GAUGE_S, RATE_S, _pair
from .replica_rules import VLLM_KINDS
from .rules import RuleIndex
from .series import Series, counter, expected, gauge, number

Group = dict[str, Any]
REPLICAS = ("replica-a:8000", "replica-b:8000")  # ``instance`` as Prometheus scrapes them
PER_MIN = 60  # requests a minute on each replica
FAST_S = 0.1  # the fast replica's mean TTFT
ITL_S = 0.02
ECC_AT = 12  # minutes before the first ECC error (past the rule's 10 m window)


def replica_tests(model: AlertModel, index: RuleIndex) -> list[Group]:
    """Every replica-outlier and GPU-fault case."""
    return _outlier_cases(model, index) + _fault_cases(index)


def _scraped(name: str, labels: dict[str, str], values: str) -> Series:
    body = ",".join(f'{k}="{v}"' for k, v in {**labels, "job": "vllm"}.items())
    return {"series": f"{name}{{{body}}}", "values": values}


def _outlier_cases(model: AlertModel, index: RuleIndex) -> list[Group]:
    pools = [p.pool for p in model.pools if p.engine in VLLM_KINDS]
    if not pools:
        return []

    def slowed(times: float) -> Any:
        def inputs(n: int) -> list[Series]:
            out = []
            for pool in pools:
                for inst, slow in zip(REPLICAS, (1.0, times), strict=True):
                    labels = {c.POOL: pool, "instance": inst, "model_name": "served-model"}
                    for hist, mean in ((c.VLLM_TTFT, FAST_S * slow), (c.VLLM_ITL, ITL_S)):
                        out.append(_scraped(f"{hist}_sum", labels, counter(PER_MIN * mean, n)))
                        out.append(_scraped(f"{hist}_count", labels, counter(PER_MIN, n)))
            return out

        return inputs

    alert = c.ALERT_REPLICA_OUTLIER
    fired = [
        expected(index.find(alert, pool=pool), {"instance": REPLICAS[1]}, 10.0) for pool in pools
    ]
    return _pair(
        alert, "one replica 10x its pool's TTFT", RATE_S, slowed(10.0), fired, slowed(2.0),
        "it is 2x",
    )  # fmt: skip


def _gpu(name: str, values: str) -> Series:
    return _scraped(name, GPU_LABELS, values)


def _fault_cases(index: RuleIndex) -> list[Group]:
    def xid(value: int) -> Any:
        return lambda n: [_gpu(c.DCGM_XID_ERRORS, gauge(value, n))]

    def ecc(errors: int) -> Any:  # none for ECC_AT minutes, then ``errors``
        return lambda n: [
            _gpu(c.DCGM_ECC_DBE_VOL, f"0+0x{ECC_AT} {errors}+0x{max(1, n - ECC_AT)}"),
            _gpu(c.DCGM_UNCORRECTABLE_ROWS, gauge(0, n)),
            _gpu(c.DCGM_ROW_REMAP_FAILURE, gauge(0, n)),
        ]

    out = _pair(
        c.ALERT_GPU_XID, "XID 79", GAUGE_S, xid(79),
        [expected(index.find(c.ALERT_GPU_XID), GPU_KEY, 79)], xid(0), "no XID was seen",
    )  # fmt: skip
    # The counter was read for longer than the rule's window before its first error.
    out += _pair(
        c.ALERT_GPU_ECC, "a double-bit ECC error", (ECC_AT + 1) * tl.STEP_S, ecc(1),
        [expected(index.find(c.ALERT_GPU_ECC), GPU_KEY, 1)], ecc(0), "no error was counted",
    )  # fmt: skip
    for reason, counter_name in THROTTLES:

        def throttled(share: float, name: str = counter_name) -> Any:
            per_min = share * 60 * 1e9  # nanoseconds throttled a minute
            return lambda n: [_gpu(name, f"0+{number(per_min)}x{n}")]

        rule = index.find(c.ALERT_GPU_THROTTLED, reason=reason)
        out += _pair(
            c.ALERT_GPU_THROTTLED, f"{reason} throttling half the time", RATE_S, throttled(0.5),
            [expected(rule, GPU_KEY, 0.5)], throttled(0.05), "5% of the time",
        )  # fmt: skip
    return out
