"""GPU and speculative-decoding alerts: what the GPU panels and the speculative-decoding
panel show, alerted on.

* ``VllmObsGPUMemoryHigh``: a GPU's frame buffer used over used + free (NVIDIA's
  dcgm-exporter ``DCGM_FI_DEV_FB_USED``/``_FREE``) above ``gpu_memory_used_max``. vLLM takes
  its ``--gpu-memory-utilization`` (0.9 by default) at start; more than that means another
  process shares the GPU, and the next allocation fails out of memory.
* ``VllmObsGPUUtilisationOutOfBand``: a GPU's ``DCGM_FI_DEV_GPU_UTIL`` outside the
  production guide's 70-95% band, ``band`` label ``high`` (saturated: add replicas) or
  ``low`` (while the fleet serves requests: more GPUs than the load needs, or a batch too
  small). dcgm-exporter labels its series by GPU and host (and pod under Kubernetes), not by
  pool: one rule for the fleet.
* ``VllmObsSpecDecodeAcceptanceDrop``: per vLLM pool, accepted over proposed draft tokens
  (``vllm:spec_decode_num_accepted_tokens`` / ``_num_draft_tokens``) over ``spec_window``
  below ``spec_acceptance_drop_ratio`` of the same ratio over the hour before: the draft
  model no longer predicts the traffic, and speculative decoding costs more than it saves.
  A pool without speculative decoding exports none of these series, and the rule never holds.
"""

from __future__ import annotations

from obs import conventions as c

from . import expr as e
from .health_rules import PCT, _alert
from .model import AlertModel, PoolHealth
from .slo_rules import Group, Rule

# dcgm-exporter's labels of one GPU: its index and its host, ``Hostname`` up to 4.5.3-4.8.2
# and ``hostname`` after (its commit d5e5f51, #655; internal/pkg/rendermetrics/render_metrics.go).
# Grouped by both, a GPU keeps its host (the other is empty) whichever release scrapes it.
GPU = ("Hostname", "hostname", "gpu")
HOST = "{{ $labels.Hostname }}{{ $labels.hostname }}"
GPU_ID = "{{ $labels.gpu }}"
BAND = "band"
VLLM_KINDS = ("vllm", "auto")


def gpu_groups(model: AlertModel) -> list[Group]:
    """One group: the fleet's GPU alerts, then each vLLM pool's speculative decoding."""
    rules = [_memory(model), *_utilisation(model)]
    rules += [_spec(model, p) for p in model.pools if p.engine in VLLM_KINDS]
    return [{"name": "vllm-obs-gpu", "rules": rules}]


def gpu_memory_used(by: tuple[str, ...] = GPU) -> str:
    """Frame buffer used over used + free, per GPU."""
    used = e.agg("sum", c.DCGM_FB_USED, *by)
    total = e.agg("sum", f"{c.DCGM_FB_USED} + {c.DCGM_FB_FREE}", *by)
    return f"{used}\n/\n{e.positive(total)}"


def _memory(model: AlertModel) -> Rule:
    limit = model.thresholds.gpu_memory_used_max
    return _alert(
        model,
        c.ALERT_GPU_MEMORY_HIGH,
        f"{gpu_memory_used()}\n> {e.num(limit)}",
        {},
        f"GPU {GPU_ID} on {HOST} has {PCT} of its memory in use",
        f"GPU {GPU_ID} on host {HOST} has {PCT} of its frame buffer in use (above "
        f"{e.num(limit * 100)}%, dcgm-exporter): more than vLLM's --gpu-memory-utilization "
        "takes, so another process shares the GPU and the next allocation may fail out of "
        "memory.",
    )


def _utilisation(model: AlertModel) -> list[Rule]:
    th = model.thresholds
    util = e.agg("avg", f"{c.DCGM_GPU_UTIL} / 100", *GPU)
    serving = e.agg("sum", e.rate(c.REQUESTS.series[0], th.rate_window))
    out = []
    for band, cond, why in (
        (
            "high",
            f"{util}\n> {e.num(th.gpu_util_high)}",
            "saturated: requests queue in the engine; add replicas or lower max_num_seqs",
        ),
        (
            "low",
            f"{util}\n< {e.num(th.gpu_util_low)}\nand on ()\n{serving} > 0",
            "underused while requests flow: fewer replicas would do, or the batch is too "
            "small (raise max_num_seqs / max_num_batched_tokens)",
        ),
    ):
        out.append(
            _alert(
                model,
                c.ALERT_GPU_UTILISATION_OUT_OF_BAND,
                cond,
                {BAND: band},
                f"GPU {GPU_ID} on {HOST} is {PCT} busy ({band})",
                f"GPU {GPU_ID} on host {HOST} was busy {PCT} of the time (dcgm-exporter), "
                f"outside the {e.num(th.gpu_util_low * 100)}-{e.num(th.gpu_util_high * 100)}% "
                f"band the production guide aims at under load: {why}.",
            )
        )
    return out


def spec_acceptance(pool: str, window: str, offset: str | None = None) -> str:
    """Accepted over proposed draft tokens of ``pool`` over ``window``."""
    at = f" offset {offset}" if offset else ""

    def total(name: str) -> str:
        return e.agg("sum", f"rate({e.selector(name, e.eq(c.POOL, pool))}[{window}]{at})", c.POOL)

    return f"{total(c.VLLM_SPEC_ACCEPTED)}\n/\n{e.positive(total(c.VLLM_SPEC_DRAFT_TOKENS))}"


def _spec(model: AlertModel, p: PoolHealth) -> Rule:
    th = model.thresholds
    ratio = e.num(th.spec_acceptance_drop_ratio)
    now = spec_acceptance(p.pool, th.spec_window)
    before = spec_acceptance(p.pool, "1h", th.spec_window)
    return _alert(
        model,
        c.ALERT_SPEC_DECODE_ACCEPTANCE_DROP,
        f"{now}\n< {ratio} * ({before})",
        {c.POOL: p.pool},
        f"Pool {p.pool} accepts {PCT} of its draft tokens, under {ratio} of the hour before",
        f"The speculative decoding of pool {p.pool} accepted {PCT} of the draft tokens it "
        f"proposed over the last {th.spec_window} (vllm:spec_decode_*), less than "
        f"{e.num(th.spec_acceptance_drop_ratio * 100)}% of its acceptance over the hour "
        "before: the draft model no longer predicts this traffic, so each step verifies "
        "tokens it throws away. Check the traffic mix, or turn speculative decoding off.",
    )
