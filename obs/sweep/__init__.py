"""``vllm-obs sweep``: the routing-profile matrix, measured on real pools.

A profile (:mod:`~obs.sweep.profile`) is a lanes/pools config plus each pool's
``vllm serve`` scheduler flags. `run_sweep` (:mod:`~obs.sweep.run`) runs
the same seeded mix over every profile, interleaved over rounds, on pools it
starts (the project's engine module) or on pools the user runs; the matrix
(:mod:`~obs.sweep.matrix`) compares them per lane on gated goodput, latency,
slow-reader penalty and rejections, with the significance tests of
``vllm-obs query compare``; :mod:`~obs.sweep.results` and
:mod:`~obs.sweep.report` write it as text, JSON, CSV and HTML.
The command's parser is :mod:`~obs.sweep.cli`; this package re-exports nothing, so that
``vllm-obs --help`` does not import the sweep's machinery.
"""
