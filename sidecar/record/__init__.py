"""The record pipeline: a finished request's way out (processors, then the exporters), the
engine-span join, the client-event budget, capture, and the OTLP payloads.
"""
