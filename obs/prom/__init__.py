"""Prometheus helpers, in one place: ``expr`` builds the PromQL the rule and dashboard
generators write, ``api`` queries a Prometheus server and reads a target's ``/metrics``
page. (Reading which metrics an expression uses serves only the tests:
``tests/support/promql_names.py``.)"""
