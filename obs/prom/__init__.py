"""Prometheus helpers, in one place: ``expr`` builds the PromQL the rule and dashboard
generators write, ``names`` reads which metrics an expression uses, ``api`` queries a
Prometheus server and reads a target's ``/metrics`` page."""
