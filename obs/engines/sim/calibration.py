"""A host calibration file: this host's corrections to the simulator and their checked error.

``vllm-obs engine sim check --fit FILE`` writes it from the operator's own ``vllm bench
serve`` results (obs.engines.sim.check); ``engine sim``, ``sweep`` and ``plan`` take it
(``--calibration FILE``). JSON::

    {"kind": "vllm-obs host calibration", "version": 1,
     "gpu": "H100", "model": "llama-3.1-8b", "tensor_parallel_size": 1,
     "calibration": {"mbu": 0.8, "step_s": 0.002, ...},   # hardware.Calibration fields
     "checked": {"files": [...], "points": 24, "median_abs_error": 0.06,
                 "max_abs_error": 0.21, "within_25": 0.9, ...,
                 "held_out": {"points": 24, "median_abs_error": 0.08,
                              "max_abs_error": 0.3, ...}}}

``calibration`` holds only the fields the fit moved (the rest keep the built-in values);
``checked`` is the corrected simulator's error on the files it was fitted on, and, given
two or more runs, ``checked.held_out`` its error on each run under corrections fitted on
the others only (leave one out). ``plan`` takes the held-out error as its margin with this
file (the fitted error when there is none).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from obs.engines.sim.hardware import CALIBRATION, Calibration
from obs.errors import ConfigError

KIND = "vllm-obs host calibration"
FIELDS = {f.name for f in fields(Calibration)}


@dataclass(frozen=True, slots=True)
class HostCalibration:
    """A calibration file's corrections (applied to the built-in values) and its error."""

    cal: Calibration
    path: str
    max_abs_error: float
    median_abs_error: float
    points: int
    setup: dict[str, Any]
    held_out: bool = False  # the errors are on runs the fit did not see


def load_calibration(path: str | Path) -> HostCalibration:
    """The file at ``path``; a :class:`ConfigError` that says what is wrong with it."""
    where = f"--calibration {path}"
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"{where}: cannot read it ({e.strerror or e})") from e
    except ValueError as e:
        raise ConfigError(f"{where}: not JSON ({e})") from e
    if not isinstance(doc, dict) or doc.get("kind") != KIND:
        raise ConfigError(
            f"{where}: not a host calibration (write one with `engine sim check --fit`)"
        )
    values = doc.get("calibration")
    checked = doc.get("checked")
    if not isinstance(values, dict) or not isinstance(checked, dict):
        raise ConfigError(f"{where}: needs its 'calibration' and 'checked' objects")
    unknown = set(values) - FIELDS
    if unknown:
        raise ConfigError(f"{where}: unknown calibration field(s) {', '.join(sorted(unknown))}")
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ConfigError(f"{where}: calibration.{key} must be a number >= 0")
    held = checked.get("held_out")
    source = held if isinstance(held, dict) and held.get("points") else checked
    error = source.get("max_abs_error")
    median = source.get("median_abs_error")
    if not all(isinstance(v, int | float) and v >= 0 for v in (error, median)):
        raise ConfigError(f"{where}: checked.max_abs_error and median_abs_error must be numbers")
    assert isinstance(error, int | float) and isinstance(median, int | float)
    setup = {k: doc[k] for k in ("gpu", "model", "tensor_parallel_size") if k in doc}
    return HostCalibration(
        replace(CALIBRATION, **{k: float(v) for k, v in values.items()}),
        str(path),
        float(error),
        float(median),
        int(source.get("points") or 0),
        setup,
        source is not checked,
    )


def calibration_doc(
    cal: Calibration, setup: dict[str, Any], checked: dict[str, Any]
) -> dict[str, Any]:
    """The file's JSON: the fields of ``cal`` that differ from the built-in ones."""
    moved = {
        f.name: getattr(cal, f.name)
        for f in fields(Calibration)
        if getattr(cal, f.name) != getattr(CALIBRATION, f.name)
    }
    return {"kind": KIND, "version": 1, **setup, "calibration": moved, "checked": checked}
