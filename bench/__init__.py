"""Benchmarks: what the relay costs (``bench.relay``, ``bench.exporter_cost``), query speed."""
