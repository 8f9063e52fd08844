"""``vllm-obs demo``: the whole product working on one machine from one command.

`run_demo` (:mod:`~obs.demo.run`) sets up the engine, starts two CPU vLLM pools (or uses real
ones), the sidecar and a Prometheus with the generated rules, drives the
six-class mix, and leaves events, rules, dashboards and an HTML report in one
folder, stopping every process it started. The pieces: :mod:`~obs.demo.options`
(what to run), :mod:`~obs.demo.stack` (processes), :mod:`~obs.demo.service` (a
monitoring server on loopback), :mod:`~obs.demo.prometheus`,
:mod:`~obs.demo.workload` (mix, lanes, load with a live view),
:mod:`~obs.demo.results` (the closing commands and tables) and
:mod:`~obs.demo.run` (the orchestration).

The command's parser is :mod:`~obs.demo.cli`; this package re-exports nothing, so that
``vllm-obs --help`` does not import the demo's machinery.
"""
