"""Benchmark ``vllm-obs query summary`` on a large synthetic request log.

Generates a realistic log (the six default lanes, each with its own prompt,
output, cache, streaming and latency distributions, a 30-minute incident on
the interactive pool, and the usual mix of errors, rejections, client errors
and disconnects), then runs ``vllm-obs query summary`` in a fresh process
several times and reports wall time and the child's peak RSS (from
``os.wait4``'s rusage, i.e. what ``/usr/bin/time -v`` calls "Maximum resident
set size").

    .venv/bin/python bench/query_bench.py                      # 600k events, JSONL
    .venv/bin/python bench/query_bench.py --parquet-events 10000000

The data is generated with DuckDB SQL (deterministic: every random draw is a
hash of the row number), written with the ``obs.events.Event`` field names in
schema order; a sample of lines is checked to load back into ``Event``. The
generated files are cached in ``--workdir`` and reused on later runs.

This is a benchmark, not a test: it prints the figures and, with ``--check``,
exits 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

from obs.events import SCHEMA_VERSION, Event

TARGET_JSONL_WALL_S = 1.5
TARGET_JSONL_RSS_MB = 400.0
TARGET_PARQUET_WALL_S = 5.0

START = "2025-06-02 00:00:00"

# lane: share of traffic, pool, model, prompt median tokens, output median tokens,
# streamed share, cache-hit share, cached share of a hit prompt, TPOT median ms.
LANES = {
    "chat": (0.40, "interactive", "llama-3.1-8b-instruct", 300, 220, 0.95, 0.25, 0.5, 18.0),
    "rag": (0.18, "interactive", "llama-3.1-8b-instruct", 3000, 260, 0.90, 0.85, 0.8, 20.0),
    "agent": (0.14, "interactive", "llama-3.1-8b-instruct", 4500, 140, 1.00, 0.90, 0.85, 19.0),
    "long-prefill": (0.06, "bulk", "qwen2.5-32b-instruct", 12000, 60, 0.80, 0.10, 0.3, 35.0),
    "batch": (0.12, "bulk", "qwen2.5-32b-instruct", 6000, 800, 0.00, 0.30, 0.4, 30.0),
    "slow-stream": (0.10, "interactive", "llama-3.1-8b-instruct", 400, 450, 1.00, 0.25, 0.5, 18.0),
}


def _u(k: int) -> str:
    """A uniform draw in (0, 1), deterministic per row ``i`` and draw number ``k``."""
    return f"(((hash(i * 64 + {k}) >> 11)::DOUBLE + 0.5) / 9007199254740992.0)"


def _z(k: int) -> str:
    """A standard normal draw (Box-Muller on two uniform draws)."""
    return f"(sqrt(-2 * ln({_u(k)})) * cos(2 * pi() * {_u(k + 1)}))"


def _lognormal(median: str, sigma: float, k: int) -> str:
    return f"({median} * exp({sigma} * {_z(k)}))"


def event_select(n: int, span_s: float, days: int = 1) -> str:
    """A SELECT producing ``n`` synthetic events, columns in ``Event`` schema order."""
    lanes_sql = []
    cum = 0.0
    for name, (share, pool, model, p_med, c_med, stream, hit, cshare, tpot) in LANES.items():
        lo, cum = cum, cum + share
        lanes_sql.append(
            f"('{name}', {lo}, {cum}, '{pool}', '{model}', {p_med}, {c_med}, "
            f"{stream}, {hit}, {cshare}, {tpot})"
        )
    lanes_values = ",\n".join(lanes_sql)
    span = span_s * days
    incident_lo, incident_hi = 0.6 * span_s, 0.6 * span_s + 1800  # 30 min, on the first day
    sql = f"""
WITH lanes(lane, lo, hi, pool, model, p_med, c_med, stream_share, hit_share, cshare, tpot_med)
AS (VALUES {lanes_values}),
r AS (
  SELECT i, {_u(1)} AS u_lane, i::DOUBLE / {n} * {span} + {_u(2)} AS t_s FROM range({n}) t(i)
),
a AS (
  SELECT r.*, l.*,
    t_s BETWEEN {incident_lo} AND {incident_hi} AND l.pool = 'interactive' AS incident,
    {_u(3)} < l.stream_share AS stream,
    {_u(4)} < l.hit_share AS hit,
    greatest(8, round({_lognormal("l.p_med", 0.6, 5)}))::INTEGER AS prompt_tokens,
    greatest(1, round({_lognormal("l.c_med", 0.7, 7)}))::INTEGER AS completion_tokens,
    {_lognormal("l.tpot_med", 0.25, 9)} AS tpot,
    {_u(11)} AS u_status,
    {_u(12)} AS u_frac
  FROM r JOIN lanes l ON r.u_lane >= l.lo AND r.u_lane < l.hi
),
b AS (
  SELECT *,
    CASE WHEN hit THEN (prompt_tokens * cshare)::INTEGER ELSE 0 END AS cached_tokens,
    CASE
      WHEN u_status < (CASE WHEN incident THEN 0.04 ELSE 0.004 END) THEN 'error'
      WHEN u_status < (CASE WHEN incident THEN 0.12 ELSE 0.012 END) THEN 'rejected'
      WHEN u_status < (CASE WHEN incident THEN 0.122 ELSE 0.014 END) THEN 'client_error'
      WHEN u_status < (CASE WHEN incident THEN 0.127 ELSE 0.017 END) THEN 'client_disconnect'
      ELSE 'ok' END AS status,
    -{_u(13)} * 0.2 + -ln({_u(14)}) * 2.0
      + CASE WHEN incident THEN {_lognormal("900", 0.8, 15)} ELSE 0 END AS q_ms,
    {_lognormal("1.0", 0.25, 17)} AS prefill_noise,
    {_lognormal("35", 0.8, 19)} AS engine_wait,
    {_lognormal("0.25", 0.5, 21)} AS ft_ms,
    CASE WHEN lane = 'slow-stream' THEN {_lognormal("1500", 1.0, 23)}
         ELSE {_lognormal("0.3", 0.5, 23)} END AS st_ms
  FROM a
),
c AS (
  SELECT *,
    (engine_wait + (CASE WHEN pool = 'bulk' THEN 0.06 ELSE 0.04 END)
       * (prompt_tokens - cached_tokens) + 8) * prefill_noise AS pf_ms,
    tpot * (completion_tokens - 1) AS dec_ms
  FROM b
),
d AS (
  SELECT *,
    CASE status
      WHEN 'rejected' THEN CASE WHEN u_frac < 0.5 THEN 0.05 ELSE 2000.0 END
      WHEN 'client_error' THEN q_ms
      ELSE q_ms END AS queue_ms,
    CASE status
      WHEN 'rejected' THEN 0.0
      WHEN 'client_error' THEN 4.0 * prefill_noise
      WHEN 'error' THEN CASE WHEN u_frac < 0.5 THEN 60000.0 * prefill_noise ELSE pf_ms END
      WHEN 'ok' THEN CASE WHEN stream THEN pf_ms ELSE pf_ms + dec_ms END
      ELSE pf_ms END AS prefill_ms,
    CASE WHEN status IN ('rejected', 'client_error')
           OR (status = 'error' AND u_frac < 0.5) THEN 0.0
         ELSE ft_ms END AS first_token_ms,
    CASE WHEN NOT stream OR status IN ('rejected', 'client_error') THEN 0.0
         WHEN status = 'error' THEN CASE WHEN u_frac < 0.5 THEN 0.0 ELSE dec_ms * u_frac END
         WHEN status = 'client_disconnect' THEN dec_ms * u_frac
         ELSE dec_ms END AS decode_ms,
    CASE WHEN status = 'ok' THEN st_ms ELSE 0.0 END AS stream_ms
  FROM c
),
e AS (
  SELECT *,
    status IN ('ok', 'client_disconnect')
      OR (status = 'error' AND u_frac >= 0.5) AS got_output,
    status IN ('ok', 'client_disconnect') AS finished_usage
  FROM d
)
SELECT
  {SCHEMA_VERSION} AS schema_version,
  strftime(TIMESTAMP '{START}' + to_microseconds((t_s * 1e6)::BIGINT),
           '%Y-%m-%dT%H:%M:%S.%gZ') AS ts,
  'req-' || substr(md5(i::VARCHAR), 1, 20) AS request_id,
  md5('t' || i::VARCHAR) AS trace_id,
  substr(md5('s' || i::VARCHAR), 1, 16) AS span_id,
  model,
  CASE WHEN status = 'rejected' THEN NULL ELSE prompt_tokens END AS prompt_tokens,
  CASE WHEN finished_usage THEN
    CASE WHEN status = 'ok' THEN completion_tokens
         ELSE greatest(1, (completion_tokens * u_frac)::INTEGER) END
  END AS completion_tokens,
  CASE WHEN stream AND got_output THEN round(queue_ms + prefill_ms + first_token_ms, 3)
  END AS ttft_ms,
  CASE WHEN stream AND status = 'ok' AND completion_tokens > 1 THEN round(tpot, 3) END AS tpot_ms,
  CASE WHEN status = 'rejected' THEN NULL ELSE hit END AS cache_hit,
  CASE WHEN status = 'ok' THEN CASE WHEN u_frac < 0.08 THEN 'length' ELSE 'stop' END
  END AS finish_reason,
  lane, 'rule' AS class_source, pool,
  'http://10.0.' || CASE WHEN pool = 'bulk' THEN '2' ELSE '1' END || '.'
    || (i % 4 + 1)::VARCHAR || ':8000' AS replica,
  NULL::VARCHAR AS arm, NULL::VARCHAR AS identity, NULL::VARCHAR AS fallback_from,
  NULL::VARCHAR AS fallback_reason,
  NULL::BIGINT AS priority,
  'tenant-' || lpad(least(40, floor(1 / {_u(25)})::INTEGER)::VARCHAR, 2, '0') AS tenant,
  '/v1/chat/completions' AS route,
  stream,
  status,
  CASE status WHEN 'ok' THEN 200 WHEN 'rejected' THEN 429 WHEN 'client_error' THEN 400
    WHEN 'error' THEN CASE WHEN u_frac < 0.5 THEN 504 ELSE 502 END ELSE 499 END AS http_status,
  CASE status WHEN 'rejected' THEN 'admission' WHEN 'client_error' THEN 'bad_request'
    WHEN 'client_disconnect' THEN 'client_disconnect'
    WHEN 'error' THEN CASE WHEN u_frac < 0.5 THEN 'upstream_timeout' ELSE 'upstream_protocol' END
  END AS error_class,
  CASE status WHEN 'rejected' THEN 'queue' WHEN 'client_error' THEN 'prefill'
    WHEN 'client_disconnect' THEN 'decode'
    WHEN 'error' THEN CASE WHEN u_frac < 0.5 THEN 'prefill' ELSE 'decode' END
  END AS error_phase,
  CASE status WHEN 'error' THEN CASE WHEN u_frac < 0.5 THEN 'no first token within 60s'
    ELSE 'upstream closed the stream' END
    WHEN 'client_error' THEN 'pool answered 400' END AS error_message,
  CASE WHEN status = 'rejected' THEN
    CASE WHEN u_frac < 0.5 THEN 'queue_full' ELSE 'queue_timeout' END END AS rejection_reason,
  CASE WHEN status = 'rejected' THEN 'lane' END AS admission_gate,
  NULL::VARCHAR AS miss_slo,  -- the sidecar's attribution: query budget recomputes it
  NULL::VARCHAR AS miss_phase,
  NULL::VARCHAR AS miss_cause,
  CASE WHEN status = 'rejected' THEN NULL ELSE cached_tokens END AS cached_tokens,
  (completion_tokens * 2)::INTEGER AS max_tokens,
  round(round(queue_ms, 3) + round(prefill_ms, 3) + round(first_token_ms, 3)
    + round(decode_ms, 3) + round(stream_ms, 3), 3) AS e2e_ms,
  CASE WHEN status = 'rejected' THEN 0.0 ELSE round(1.0 + u_frac, 3) END AS upload_ms,
  round(queue_ms, 3) AS queue_ms,
  round(prefill_ms, 3) AS prefill_ms,
  round(first_token_ms, 3) AS first_token_ms,
  round(decode_ms, 3) AS decode_ms,
  round(stream_ms, 3) AS stream_ms,
  NULL::BIGINT AS client_unread_bytes,
  CASE WHEN lane = 'slow-stream' AND status = 'ok' THEN round(stream_ms * 0.8, 3)
       ELSE 0.0 END AS stream_blocked_ms,
  CASE WHEN NOT got_output THEN 0 WHEN NOT stream THEN 1
       ELSE completion_tokens END AS output_chunks,
  CASE WHEN got_output THEN 1 END AS burst_chunks,
  CASE WHEN got_output THEN 'usage' END AS tokens_source,
  CASE WHEN stream AND got_output AND completion_tokens > 1 THEN round(tpot * 0.97, 3)
  END AS itl_p50_ms,
  CASE WHEN stream AND got_output AND completion_tokens > 1
    THEN round(tpot * {_lognormal("1.5", 0.2, 27)}, 3) END AS itl_p95_ms,
  CASE WHEN stream AND got_output AND completion_tokens > 1
    THEN round(tpot * {_lognormal("4.0", 0.5, 29)}, 3) END AS itl_max_ms,
  NOT stream AS usage_injected,
  'absent' AS engine_view,
  NULL::DOUBLE AS engine_queue_ms,
  NULL::DOUBLE AS engine_prefill_ms,
  NULL::DOUBLE AS engine_decode_ms,
  NULL::DOUBLE AS engine_inference_ms,
  NULL::DOUBLE AS engine_ttft_ms,
  NULL::INTEGER AS pool_in_flight,  -- the dispatch snapshot: no pool state in generated traffic
  NULL::INTEGER AS pool_max_running,
  NULL::INTEGER AS pool_waiting,
  NULL::DOUBLE AS pool_kv_usage,
  NULL::BOOLEAN AS pool_preempting,
  NULL::INTEGER AS pool_ahead_prompt_tokens,
  NULL::INTEGER AS pool_prompt_tokens_during,
  NULL::INTEGER AS pool_requests_during,
  NULL::DOUBLE AS pool_others_prompt_share,
  NULL::DOUBLE AS pool_others_running_share,
  CASE WHEN lane IN ('rag', 'agent') THEN substr(md5(lane || (i % 97)::VARCHAR), 1, 12)
  END AS prefix_fingerprint,
  CASE WHEN status = 'rejected' THEN NULL
       WHEN pool = 'bulk' THEN '7c1e0a93d2b4' ELSE 'a41f9e20c6d8' END AS settings_fingerprint,
  '5d0c3b7e91fa' AS config_fingerprint,
  NULL::BIGINT AS summarized,
  CASE WHEN lane = 'agent' AND status = 'ok' THEN i % 50 <> 0 END AS json_valid,
  NULL::VARCHAR AS prompt_text,
  NULL::VARCHAR AS output_text
FROM e
"""
    return sql


def _check_schema(sql_columns: list[str]) -> None:
    names = [f.name for f in dataclasses.fields(Event)]
    if sql_columns != names:
        raise SystemExit(f"generator columns differ from Event fields: {sql_columns} != {names}")


def generate_jsonl(path: Path, n: int) -> None:
    """Write ``n`` synthetic events as JSONL (one ``Event`` per line, schema order)."""
    import duckdb

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    rel = con.sql(event_select(n, 86400.0))
    _check_schema(rel.columns)
    tmp = path.with_suffix(".tmp")
    con.execute(f"COPY ({event_select(n, 86400.0)} ORDER BY i) TO '{tmp}' (FORMAT json)")
    with tmp.open("rb") as f:
        for _, line in zip(range(1000), f, strict=False):
            Event(**orjson.loads(line))  # every line must load back into the dataclass
    tmp.rename(path)


def generate_parquet(out: Path, n: int, days: int = 7) -> None:
    """Write ``n`` synthetic events as a Parquet dataset, as ``query export`` lays it out."""
    import duckdb

    from obs.query.parquet import copy_dataset

    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")
    sql = event_select(n, 86400.0, days=days)
    _check_schema(con.sql(sql).columns)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    copy_dataset(con, f"({sql})", tmp)
    tmp.rename(out)


def in_fresh_process(fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(*args)`` in a spawned interpreter, not in this one.

    The generators run DuckDB, which leaves this process gigabytes large; Linux records a
    process's size at ``exec`` in the new program's peak RSS, so every child measured
    after an in-process generation would report this process's size as its own peak."""
    proc = multiprocessing.get_context("spawn").Process(target=fn, args=args)
    proc.start()
    proc.join()
    if proc.exitcode:
        raise SystemExit(f"generating the benchmark log failed (exit {proc.exitcode})")


def run_child(cmd: list[str]) -> tuple[float, float, float, int]:
    """Run ``cmd``; return wall s, CPU s (user+sys), peak RSS MB of that child, exit code."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    err = proc.stderr.read().decode() if proc.stderr else ""
    if proc.returncode:
        print(err, file=sys.stderr)
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, proc.returncode


def bench(
    label: str, cmd: list[str], repeat: int, wall_target: float, rss_target: float | None
) -> bool:
    runs = [run_child(cmd) for _ in range(repeat)]
    if any(rc for *_, rc in runs):
        raise SystemExit(f"{label}: command failed: {' '.join(cmd)}")
    walls = sorted(r[0] for r in runs)
    cpus = sorted(r[1] for r in runs)
    rss = max(r[2] for r in runs)
    median = walls[len(walls) // 2]
    ok = median <= wall_target and (rss_target is None or rss <= rss_target)
    rss_t = f" (target <= {rss_target:.0f} MB)" if rss_target else ""
    load = os.getloadavg()[0]
    print(
        f"{label}: wall median {median:.2f} s, min {walls[0]:.2f} s, max {walls[-1]:.2f} s "
        f"over {repeat} runs (target <= {wall_target} s); CPU (user+sys) median "
        f"{cpus[len(cpus) // 2]:.2f} s; peak RSS {rss:.0f} MB{rss_t} -> "
        f"{'OK' if ok else 'MISSED'}"
    )
    print(f"  {os.cpu_count()} CPUs, load average {load:.1f} when done")
    print(f"  command: {' '.join(cmd)}")
    return ok


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--events", type=int, default=600_000, help="JSONL events (default 600000)")
    p.add_argument(
        "--parquet-events",
        type=int,
        default=0,
        help="also benchmark a Parquet dataset of this many events (e.g. 10000000)",
    )
    p.add_argument("--workdir", type=Path, default=Path("/tmp/vllm-obs-bench"))
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--check", action="store_true", help="exit 1 when a target is missed")
    args = p.parse_args(argv)
    args.workdir.mkdir(parents=True, exist_ok=True)
    exe = shutil.which("vllm-obs", path=str(Path(sys.executable).parent)) or "vllm-obs"

    ok = True
    if args.events:
        log = args.workdir / f"events-{args.events}.jsonl"
        if not log.exists():
            t0 = time.perf_counter()
            in_fresh_process(generate_jsonl, log, args.events)
            size = log.stat().st_size / 1e6
            print(f"generated {log} ({size:.0f} MB) in {time.perf_counter() - t0:.1f} s")
        cmd = [exe, "query", "summary", str(log)]
        ok &= bench(
            f"{args.events} events JSONL",
            cmd,
            args.repeat,
            TARGET_JSONL_WALL_S,
            TARGET_JSONL_RSS_MB,
        )
    if args.parquet_events:
        ds = args.workdir / f"events-{args.parquet_events}.parquet.d"
        if not ds.exists():
            t0 = time.perf_counter()
            in_fresh_process(generate_parquet, ds, args.parquet_events)
            print(f"generated {ds} in {time.perf_counter() - t0:.1f} s")
        cmd = [exe, "query", "summary", str(ds)]
        ok &= bench(
            f"{args.parquet_events} events Parquet", cmd, args.repeat, TARGET_PARQUET_WALL_S, None
        )
    return 0 if ok or not args.check else 1


if __name__ == "__main__":
    sys.exit(main())
