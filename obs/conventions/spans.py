"""Span and OTLP attribute names: OpenTelemetry's semantic conventions (the GenAI ones at the
version ``genai.py`` pins) and this project's own."""

from __future__ import annotations

from typing import Final

# --- Span attributes (the OTLP encoder, exporters/otlp_proto.py; Tempo links in dashboards) ---
# OpenTelemetry semantic conventions: GenAI (gen_ai.*), HTTP, server, error.
ATTR_OPERATION: Final = "gen_ai.operation.name"
ATTR_SYSTEM: Final = "gen_ai.system"  # up to v1.36.0; dropped under the opt-in (genai.py)
ATTR_PROVIDER: Final = "gen_ai.provider.name"
ATTR_REQUEST_MODEL: Final = "gen_ai.request.model"
ATTR_REQUEST_MAX_TOKENS: Final = "gen_ai.request.max_tokens"
ATTR_REQUEST_STREAM: Final = "gen_ai.request.stream"
ATTR_INPUT_TOKENS: Final = "gen_ai.usage.input_tokens"
ATTR_OUTPUT_TOKENS: Final = "gen_ai.usage.output_tokens"
ATTR_CACHED_INPUT_TOKENS: Final = "gen_ai.usage.cache_read.input_tokens"
ATTR_FINISH_REASONS: Final = "gen_ai.response.finish_reasons"
ATTR_RESPONSE_MODEL: Final = "gen_ai.response.model"
ATTR_TIME_TO_FIRST_CHUNK: Final = "gen_ai.response.time_to_first_chunk"  # seconds, streamed
ATTR_TOKEN_TYPE: Final = "gen_ai.token.type"  # on gen_ai.client.token.usage
ATTR_HTTP_ROUTE: Final = "http.route"
ATTR_HTTP_METHOD: Final = "http.request.method"
ATTR_HTTP_STATUS: Final = "http.response.status_code"
ATTR_SERVER_ADDRESS: Final = "server.address"
ATTR_SERVER_PORT: Final = "server.port"
ATTR_ERROR_TYPE: Final = "error.type"
# This project's own, under its namespace.
ATTR_LANE: Final = "vllm_obs.lane"
ATTR_POOL: Final = "vllm_obs.pool"
ATTR_REQUEST_ID: Final = "vllm_obs.request_id"
ATTR_STATUS: Final = "vllm_obs.status"
ATTR_TENANT: Final = "vllm_obs.tenant"
ATTR_TTFT_MS: Final = "vllm_obs.ttft_ms"
ATTR_TPOT_MS: Final = "vllm_obs.tpot_ms"
ATTR_STREAM_BLOCKED_MS: Final = "vllm_obs.stream_blocked_ms"
ATTR_REJECTION_REASON: Final = "vllm_obs.rejection_reason"
ATTR_PHASE: Final = "vllm_obs.phase"
