"""The GPU faults NVIDIA's dcgm-exporter reports, alerted on (per GPU: its host and ``gpu``,
``gpu_rules.GPU``).

* ``VllmObsGPUXidError``: ``DCGM_FI_DEV_XID_ERRORS`` (a gauge: the last XID error's number)
  above 0: the driver reported an XID (79: fell off the bus; 48, 63, 64: memory; 13, 31, 43:
  an application fault). dcgm-exporter labels it ``err_code`` and ``err_msg`` (the XID in
  words, ``internal/pkg/collector/gpu_collector.go``); the alert keeps ``err_msg``. A page:
  the replica on that GPU may compute wrongly or hang.
* ``VllmObsGPUMemoryErrors``: double-bit (uncorrectable) volatile ECC errors or rows remapped
  for uncorrectable errors in the last ``ECC_WINDOW``, or a failed row remap. A page.
* ``VllmObsGPUThrottled``: the share of the last ``THROTTLE_WINDOW`` the GPU's clocks were held
  down by its thermal or power limit (``DCGM_FI_DEV_THERMAL_VIOLATION``,
  ``_POWER_VIOLATION``: counters of nanoseconds, as dcgm-exporter's ``etc/default-counters.csv``
  says since its commit e61056b, #589, and DCGM's field ids do), label ``reason``, above
  ``THROTTLE_MAX``: the replica on it computes slower than its pool's others
  (``VllmObsReplicaOutlier``).

dcgm-exporter ships the XID gauge and the row-remap series in its default counters; the ECC
and violation counters are commented out there and must be enabled (docs/alerts.md). A GPU
that reports none of a rule's series never fires it.
"""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .gpu_rules import GPU, GPU_ID, HOST
from .health_rules import _alert
from .model import AlertModel
from .slo_rules import Group, Rule

XID_TEXT = "err_msg"  # dcgm-exporter's label of the XID gauge: the error in words
REASON = "reason"
NS_PER_S = "1e9"  # the violation counters count nanoseconds throttled
ECC_WINDOW = "10m"
THROTTLE_WINDOW = "5m"
THROTTLE_MAX = 0.1  # a tenth of the time throttled
THROTTLES = (("thermal", c.DCGM_THERMAL_VIOLATION), ("power", c.DCGM_POWER_VIOLATION))


def gpu_fault_groups(model: AlertModel) -> list[Group]:
    """One group: XID errors, memory errors and throttling, for the fleet's GPUs."""
    return [{"name": "vllm-obs-gpu-faults", "rules": [_xid(model), _ecc(model), *_throttle(model)]}]


def _xid(model: AlertModel) -> Rule:
    return _alert(
        model,
        c.ALERT_GPU_XID,
        f"{e.agg('max', c.DCGM_XID_ERRORS, *GPU, XID_TEXT)} > 0",
        {},
        f"GPU {GPU_ID} on {HOST} reported XID {{{{ $value }}}}",
        f"GPU {GPU_ID} on host {HOST} reported XID error {{{{ $value }}}} (dcgm-exporter's "
        "DCGM_FI_DEV_XID_ERRORS, the last one seen; its err_msg label says it in words). The "
        "replica on it may hang or answer "
        "wrongly: drain it, read the driver's log (dmesg: NVRM: Xid), and reset or replace the "
        "GPU before it serves again.",
    )


def _ecc(model: AlertModel) -> Rule:
    dbe, rows = (_growth(x) for x in (c.DCGM_ECC_DBE_VOL, c.DCGM_UNCORRECTABLE_ROWS))
    failed = e.agg("max", c.DCGM_ROW_REMAP_FAILURE, *GPU)
    return _alert(
        model,
        c.ALERT_GPU_ECC,
        f"{dbe} > 0\nor\n{rows} > 0\nor\n{failed} > 0",
        {},
        f"GPU {GPU_ID} on {HOST} has uncorrectable memory errors ({{{{ $value }}}})",
        f"GPU {GPU_ID} on host {HOST} counted {{{{ $value }}}} uncorrectable memory errors "
        f"(double-bit ECC or rows remapped for them) in the last {ECC_WINDOW}, or failed to "
        "remap a row (dcgm-exporter). Data on it may be corrupt: drain the replica on it and "
        "reset the GPU (a failed remap: replace it).",
    )


def _growth(counter: str) -> str:
    """How much ``counter`` grew per GPU over ``ECC_WINDOW``: now less then (exact, where
    ``increase`` extrapolates; a counter reset by a driver reload reads negative)."""
    now = e.agg("sum", counter, *GPU)
    then = e.agg("sum", f"{counter} offset {ECC_WINDOW}", *GPU)
    return f"({now} - {then})"


def _throttle(model: AlertModel) -> list[Rule]:
    out = []
    for reason, counter in THROTTLES:
        share = e.agg("max", e.rate(counter, THROTTLE_WINDOW), *GPU)
        out.append(
            _alert(
                model,
                c.ALERT_GPU_THROTTLED,
                f"{share} / {NS_PER_S}\n> {e.num(THROTTLE_MAX)}",
                {REASON: reason},
                f"GPU {GPU_ID} on {HOST} throttled ({reason}) {{{{ $value | humanizePercentage }}}}"
                " of the time",
                f"GPU {GPU_ID} on host {HOST} had its clocks held down by its {reason} limit "
                f"{{{{ $value | humanizePercentage }}}} of the last {THROTTLE_WINDOW} "
                "(dcgm-exporter's violation counters): the replica on it computes slower than "
                "its pool's others. Check cooling and power capping; drain it if it is the "
                "pool's outlier (VllmObsReplicaOutlier).",
            )
        )
    return out
