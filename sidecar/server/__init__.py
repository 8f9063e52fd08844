"""The sidecar's own HTTP server: the listener's connections (HTTP/1.1 on httptools), their
limits and counters, the client connection's write buffer, and the processes of ``--workers``.

Knows nothing of relaying: it hands each request to the app as an ``Exchange``
(:mod:`obs.sidecar.server.wire`). Imports nothing from ``relay``, ``policy``, ``record`` or
``pools`` (the import contract in pyproject.toml).
"""
