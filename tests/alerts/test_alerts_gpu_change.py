"""The GPU, speculative-decoding and settings-change alerts, on the committed rules and
Prometheus' own promtool: fed the series of the captured dcgm-exporter and vLLM
speculative-decoding pages (tests/data, their names and label sets as written there, the
``pool`` and scrape labels as Prometheus adds them), each fires past its threshold and is
silent inside it."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from obs import conventions as c
from obs.alerts.rules import RuleIndex
from obs.alerts.series import expected
from tests.conftest import require_binary

pytestmark = pytest.mark.stack

ROOT = Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "rules" / "health.rules.yml"
DATA = ROOT / "tests" / "data"
SAMPLE = re.compile(r"^([A-Za-z_:][\w:]*)\{(.*)\} (\S+)$")
STEPS = 240  # four hours, a sample a minute


def page_series(path: Path) -> dict[str, tuple[str, float]]:
    """Metric name -> (its label set as the page writes it, its value), first series each."""
    out: dict[str, tuple[str, float]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        m = SAMPLE.match(line)
        if m and m.group(1) not in out:
            out[m.group(1)] = (m.group(2), float(m.group(3)))
    return out


def _series(name: str, labels: str, values: str, **extra: str) -> dict[str, str]:
    more = "".join(f',{k}="{v}"' for k, v in extra.items())
    return {"series": f'{name}{{{labels}{more},job="scrape",instance="x:1"}}', "values": values}


def _run(tmp_path: Path, series: list[dict[str, str]], tests: list[dict[str, Any]]) -> str:
    doc = {
        "rule_files": [str(RULES)],
        "evaluation_interval": "1m",
        "tests": [{"interval": "1m", "input_series": series, "alert_rule_test": tests}],
    }
    path = tmp_path / "case.test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False), encoding="utf-8")
    proc = subprocess.run(
        [require_binary("promtool"), "test", "rules", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


INDEX = RuleIndex({RULES.name: yaml.safe_load(RULES.read_text(encoding="utf-8"))})


def _firing(
    alert: str, at: str, labels: dict[str, str] | None, value: float = 0.0
) -> dict[str, Any]:
    """An alert_rule_test: ``alert`` fires at ``at`` with ``labels`` (the rule's static ones
    and the series') and its annotations rendered for ``value``; or, labels None, not at all."""
    if labels is None:
        return {"eval_time": at, "alertname": alert, "exp_alerts": []}
    static = {k: v for k, v in labels.items() if k in ("lane", "pool", "band", "slo")}
    rule = INDEX.find(alert, **static)
    series = {k: v for k, v in labels.items() if k not in rule["labels"]}
    return {"eval_time": at, "alertname": alert, "exp_alerts": [expected(rule, series, value)]}


def _dcgm(util: float, free: float) -> list[dict[str, str]]:
    page = page_series(DATA / "dcgm-exporter-metrics.txt")
    out = []
    for name, value in ((c.DCGM_GPU_UTIL, util), (c.DCGM_FB_FREE, free)):
        labels, _ = page[name]
        out.append(_series(name, labels, f"{value:g}+0x{STEPS}"))
    labels, used = page[c.DCGM_FB_USED]
    out.append(_series(c.DCGM_FB_USED, labels, f"{used:g}+0x{STEPS}"))
    return out


def _gpu_labels(**more: str) -> dict[str, str]:
    return {"Hostname": "node-a", "gpu": "0", **more}


def test_the_captured_gpu_page_as_is_raises_nothing(tmp_path: Path) -> None:
    """The page's GPU (87% busy, 91% of memory used: vLLM's share) is inside every bound."""
    _, util = page_series(DATA / "dcgm-exporter-metrics.txt")[c.DCGM_GPU_UTIL]
    _, free = page_series(DATA / "dcgm-exporter-metrics.txt")[c.DCGM_FB_FREE]
    requests = _series(c.REQUESTS.series[0], 'lane="chat",pool="interactive"', f"0+60x{STEPS}")
    _run(
        tmp_path,
        [*_dcgm(util, free), requests],
        [
            _firing(c.ALERT_GPU_MEMORY_HIGH, "60m", None),
            _firing(c.ALERT_GPU_UTILISATION_OUT_OF_BAND, "60m", None),
        ],
    )


def test_gpu_memory_and_utilisation_alerts_fire_out_of_band(tmp_path: Path) -> None:
    """Free memory down to 1 GiB (99% used) and 99% busy fire; 40% busy while requests flow
    fires the low band; 40% busy with no requests is silent."""
    _run(
        tmp_path,
        _dcgm(99, 1000),
        [
            _firing(c.ALERT_GPU_MEMORY_HIGH, "5m", None),  # pending (holds 10 m)
            _firing(c.ALERT_GPU_MEMORY_HIGH, "20m", _gpu_labels(), 73650 / (73650 + 1000)),
            _firing(c.ALERT_GPU_UTILISATION_OUT_OF_BAND, "40m", _gpu_labels(band="high"), 0.99),
        ],
    )
    requests = _series(c.REQUESTS.series[0], 'lane="chat",pool="interactive"', f"0+60x{STEPS}")
    _run(
        tmp_path,
        [*_dcgm(40, 7421), requests],
        [_firing(c.ALERT_GPU_UTILISATION_OUT_OF_BAND, "40m", _gpu_labels(band="low"), 0.4)],
    )
    _run(tmp_path, _dcgm(40, 7421), [_firing(c.ALERT_GPU_UTILISATION_OUT_OF_BAND, "40m", None)])


def _spec(after_accepted_per_min: float) -> list[dict[str, str]]:
    """The page's draft and accepted counters on pool interactive: 30 draft tokens a minute,
    the page's acceptance (210 of 360) for two hours, then ``after_accepted_per_min``."""
    page = page_series(DATA / "vllm-0.32-spec-lora-metrics.txt")
    drafts, _ = page[c.VLLM_SPEC_DRAFT_TOKENS]
    accepted_labels, accepted = page[c.VLLM_SPEC_ACCEPTED]
    _, proposed = page[c.VLLM_SPEC_DRAFT_TOKENS]
    before = 30 * accepted / proposed
    after = f"{before * 120:g}+{after_accepted_per_min:g}x{STEPS - 120}"
    return [
        _series(c.VLLM_SPEC_DRAFT_TOKENS, drafts, f"0+30x{STEPS}", pool="interactive"),
        _series(
            c.VLLM_SPEC_ACCEPTED,
            accepted_labels,
            f"0+{before:g}x120 {after}",
            pool="interactive",
        ),
    ]


def test_spec_decode_acceptance_drop_fires_on_the_captured_counters(tmp_path: Path) -> None:
    """Acceptance falls from the page's 58% to 10% at 2 h: fires; to 50% (0.86x): silent."""
    labels = {"pool": "interactive"}
    _run(
        tmp_path,
        _spec(3),
        [
            _firing(c.ALERT_SPEC_DECODE_ACCEPTANCE_DROP, "110m", None),
            _firing(c.ALERT_SPEC_DECODE_ACCEPTANCE_DROP, "150m", labels, 0.1),
        ],
    )
    _run(tmp_path, _spec(15), [_firing(c.ALERT_SPEC_DECODE_ACCEPTANCE_DROP, "150m", None)])


def _ttft(after_bucket: str, changed: bool) -> list[dict[str, str]]:
    """Lane chat on pool interactive: 10 requests a minute, TTFT under 0.25 s for two hours,
    then in the bucket ``after_bucket``; the pool's settings change at 2 h (if ``changed``)."""
    lp = 'lane="chat",pool="interactive"'
    out = []
    for le in ("0.25", "0.5", "1", "+Inf"):
        before_n = 10
        after_n = 10 if float(le) >= float(after_bucket) else 0
        values = f"0+{before_n}x120 {1200 + after_n}+{after_n}x{STEPS - 121}"
        out.append(_series(c.TTFT.series[0], f'{lp},le="{le}"', values))
    out.append(_series(c.TTFT.series[2], lp, f"0+10x{STEPS}"))
    if changed:
        labels = (
            'pool="interactive",replica="http://r:8000",changed="max_num_seqs",old="64",new="256"'
        )
        out.append(_series(c.POOL_SETTINGS_CHANGED.name, labels, f"_x120 7200+0x{STEPS - 121}"))
    return out


def test_settings_change_regression_fires_when_ttft_doubles_after_a_change(
    tmp_path: Path,
) -> None:
    """TTFT moves a bucket up (p95 0.24 s -> 0.49 s) after a settings change: fires for the
    lane's TTFT; the same shift with no change, or no shift after one, is silent."""
    alert = c.ALERT_SETTINGS_CHANGE_REGRESSION
    labels = {"lane": "chat", "pool": "interactive", "slo": "ttft"}
    p95 = 0.25 + 0.25 * 0.95  # every request of the last 15 m in (0.25, 0.5]
    _run(
        tmp_path,
        _ttft("0.5", changed=True),
        [_firing(alert, "110m", None), _firing(alert, "150m", labels, p95)],
    )
    _run(tmp_path, _ttft("0.5", changed=False), [_firing(alert, "150m", None)])
    _run(tmp_path, _ttft("0.25", changed=True), [_firing(alert, "150m", None)])
    _run(tmp_path, _ttft("0.5", changed=True), [_firing(alert, "230m", None)])  # > 1 h ago
