"""One request's way through the sidecar: read, classify, admit, dispatch, stream, finish.

The routes the sidecar answers itself are here too (``/v1/models``, ``POST /v1/traces``).
Above ``record``, ``pools``, ``server`` and ``policy``; only the app (``obs.sidecar.app``)
is above it.
"""
