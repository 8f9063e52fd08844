# The vllm-obs sidecar image (also carries the rest of the vllm-obs CLI).
#
#   docker build -t vllm-obs .
#   docker run -p 8000:8000 -v $PWD/lanes.yaml:/etc/vllm-obs/lanes.yaml:ro vllm-obs
#
# Port 8000, the only one: the OpenAI-compatible API, /metrics, /health and the
# OTLP/HTTP receiver for vLLM's llm_request spans (point `vllm serve
# --otlp-traces-endpoint` at http://<sidecar>:8000/v1/traces).

FROM python:3.12-slim AS build
WORKDIR /src
COPY . .
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.12-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl \
    && rm -rf /wheels \
    && useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin vllm-obs \
    && mkdir -p /etc/vllm-obs /var/log/vllm-obs \
    && chown vllm-obs /var/log/vllm-obs
USER vllm-obs
EXPOSE 8000
CMD ["vllm-obs", "sidecar", "--config", "/etc/vllm-obs/lanes.yaml", "--host", "0.0.0.0", "--port", "8000", "--events", "/var/log/vllm-obs/events.jsonl"]
