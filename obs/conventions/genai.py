"""The OpenTelemetry GenAI semantic conventions this project follows, pinned to one version.

Pinned: semantic-conventions **v1.41.0** (docs/gen-ai/, status Development), the last release
that held the GenAI conventions before they moved to their own repository. Names, units and
bucket advice below are that version's. The conventions' transition plan: instrumentations
that emitted v1.36.0 or earlier keep emitting it by default, and emit only the latest
experimental version when ``OTEL_SEMCONV_STABILITY_OPT_IN`` lists ``gen_ai_latest_experimental``
(``latest_genai``). Here that means: ``gen_ai.system`` (renamed ``gen_ai.provider.name``) is
dropped under the opt-in; new attributes (``gen_ai.response.model``,
``gen_ai.response.time_to_first_chunk``, ``server.port``) and the OTLP metrics are emitted
either way, as they rename nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

GENAI_SEMCONV_VERSION: Final = "1.41.0"
OTEL_SEMCONV_STABILITY_OPT_IN: Final = "OTEL_SEMCONV_STABILITY_OPT_IN"
GENAI_OPT_IN: Final = "gen_ai_latest_experimental"
# gen_ai.provider.name: not a well-known value (those name hosted APIs); the conventions allow
# a custom one. The pools' engine speaks vLLM's OpenAI-compatible API.
PROVIDER: Final = "vllm"
TOKEN_INPUT: Final = "input"  # gen_ai.token.type values
TOKEN_OUTPUT: Final = "output"


def latest_genai(environ: Mapping[str, str]) -> bool:
    """True when ``OTEL_SEMCONV_STABILITY_OPT_IN`` asks for the latest GenAI conventions only."""
    values = environ.get(OTEL_SEMCONV_STABILITY_OPT_IN, "")
    return GENAI_OPT_IN in {v.strip() for v in values.split(",")}


@dataclass(frozen=True, slots=True)
class GenAiMetric:
    """One histogram of the conventions: name, unit, description and advised buckets."""

    name: str
    unit: str
    description: str
    buckets: tuple[float, ...]


_SECONDS_WIDE: Final = (0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48,
                        40.96, 81.92)  # fmt: skip
GENAI_REQUEST_DURATION: Final = GenAiMetric(
    "gen_ai.server.request.duration",
    "s",
    "Generative AI server request duration such as time-to-last byte or last output token.",
    _SECONDS_WIDE,
)
GENAI_TIME_TO_FIRST_TOKEN: Final = GenAiMetric(
    "gen_ai.server.time_to_first_token",
    "s",
    "Time to generate first token for successful responses.",
    (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0),
)
GENAI_TIME_PER_OUTPUT_TOKEN: Final = GenAiMetric(
    "gen_ai.server.time_per_output_token",
    "s",
    "Time per output token generated after the first token for successful responses.",
    (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5),
)
# A client metric in the conventions: the sidecar is its pools' client, and their usage is
# what it reports (gen_ai.token.type input or output).
GENAI_TOKEN_USAGE: Final = GenAiMetric(
    "gen_ai.client.token.usage",
    "{token}",
    "Number of input and output tokens used.",
    tuple(float(4**i) for i in range(14)),  # 1, 4, 16, ..., 67108864
)
GENAI_METRICS: Final = (
    GENAI_REQUEST_DURATION,
    GENAI_TIME_TO_FIRST_TOKEN,
    GENAI_TIME_PER_OUTPUT_TOKEN,
    GENAI_TOKEN_USAGE,
)
