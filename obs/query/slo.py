"""How one request is judged against its lane's SLOs, as SQL expressions.

The rules (the docs repeat them):

* **TTFT value** is ``ttft_ms``. A non-streamed request has no ``ttft_ms``:
  its first token reaches the client with the whole answer, so a successful
  non-streamed request is judged on ``e2e_ms`` (vLLM's benchmark does the
  same for non-streamed requests). A request with neither (failed before any
  output) is not judged on TTFT.
* **TPOT value** is ``tpot_ms``; requests without it (non-streamed, one
  output token, failed before the second token) are not judged on TPOT.
* A request **meets** a latency SLO when its value is ``<= threshold_ms``.
  **Attainment** = requests meeting it / requests judged on it.
* **Availability** = 1 - requests with a status in ``BAD_OUTCOMES`` (server-side
  failures: ``error``) / all requests. Rejections, client errors and client
  disconnects do not count against it.
* A request is **good** (goodput) when its status is ``ok`` and it meets every
  latency SLO of its lane that judges it. Rejected, failed and abandoned
  requests are never good. **goodput_ratio** = good / all requests.
* An SLO is **met** by a lane when attainment >= the objective.

Requests of lanes the config does not name are judged on no latency SLO.
"""

from __future__ import annotations

from obs.config import Config
from obs.conventions import BAD_OUTCOMES, OK
from obs.query.dialect import DUCKDB, Dialect
from obs.query.filters import sql_str

TTFT_VALUE = f"coalesce(ttft_ms, CASE WHEN NOT stream AND status = '{OK}' THEN e2e_ms END)"
BAD = "status IN (" + ", ".join(sql_str(s) for s in BAD_OUTCOMES) + ")"


def _by_lane(config: Config, kind: str, attr: str, dialect: Dialect) -> str:
    """``CASE WHEN lane = ...``: the lane's value of ``slo.<kind>.<attr>`` (NULL if none)."""
    whens = []
    for lane in config.lanes:
        slo = getattr(lane.slo, kind)
        if slo is not None:
            whens.append(f"WHEN lane = {sql_str(lane.name)} THEN {float(getattr(slo, attr))!r}")
    return f"(CASE {' '.join(whens)} END)" if whens else dialect.null_double


def threshold(config: Config, kind: str, dialect: Dialect = DUCKDB) -> str:
    """SQL: the request's lane threshold for ``ttft`` or ``tpot`` in ms (NULL if none)."""
    return _by_lane(config, kind, "threshold_ms", dialect)


def objective(config: Config, kind: str, dialect: Dialect = DUCKDB) -> str:
    """SQL: the request's lane objective for ``ttft``, ``tpot`` or ``availability``."""
    return _by_lane(config, kind, "objective", dialect)


def judged_rows(config: Config, source: str, dialect: Dialect = DUCKDB) -> str:
    """``source`` plus per-request SLO flags, each computed once per row.

    Adds ``_ttft_judged``, ``_ttft_met``, ``_tpot_judged``, ``_tpot_met`` and
    ``_good`` (never null; the ``_met`` ones imply ``_judged``). Written in SQL
    that both engines run: no ``EXCLUDE``, no boolean literals.
    """
    no = "1 = 0"
    inner = (
        f"SELECT *, {threshold(config, 'ttft', dialect)} AS _ttft_thr, "
        f"{threshold(config, 'tpot', dialect)} AS _tpot_thr, {TTFT_VALUE} AS _ttft_v FROM {source}"
    )
    judged = (
        "SELECT *, _ttft_thr IS NOT NULL AND _ttft_v IS NOT NULL AS _ttft_judged, "
        f"_tpot_thr IS NOT NULL AND tpot_ms IS NOT NULL AS _tpot_judged FROM ({inner})"
    )
    met = (
        f"SELECT *, _ttft_judged AND coalesce(_ttft_v <= _ttft_thr, {no}) AS _ttft_met, "
        f"_tpot_judged AND coalesce(tpot_ms <= _tpot_thr, {no}) AS _tpot_met FROM ({judged})"
    )
    flags = (
        f"SELECT *, status = '{OK}' AND (_ttft_met OR NOT _ttft_judged) "
        f"AND (_tpot_met OR NOT _tpot_judged) AS _good FROM ({met})"
    )
    return f"({flags})"
