"""SSE parsing of vLLM's stream shape and the per-request measurement it feeds."""

from __future__ import annotations

import pytest

from obs.loadgen.measure import Measurement
from obs.loadgen.sse import Chunk, SSEParser, error_message, parse_chunk

# From shared/reference/vllm-0.32-sse-capture.txt: chat, stream, include_usage (trimmed ids).
CAPTURE = (
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"tiny","choices":'
    b'[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,'
    b'"finish_reason":null}],"prompt_token_ids":null,"prompt_text":null}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"tiny","choices":'
    b'[{"index":0,"delta":{"content":"sses"},"logprobs":null,"finish_reason":null,'
    b'"token_ids":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"tiny","choices":'
    b'[{"index":0,"delta":{"content":"sses"},"logprobs":null,"finish_reason":null,'
    b'"token_ids":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"tiny","choices":'
    b'[{"index":0,"delta":{"content":"sses"},"logprobs":null,"finish_reason":"length",'
    b'"stop_reason":null,"token_ids":null}]}\n\n'
    b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"tiny","choices":[],'
    b'"usage":{"prompt_tokens":11,"total_tokens":14,"completion_tokens":3,'
    b'"prompt_tokens_details":{"cached_tokens":0,"created_cache_tokens":0}}}\n\n'
    b"data: [DONE]\n\n"
)


@pytest.mark.parametrize("size", [1, 7, 64, len(CAPTURE)])
def test_parser_yields_the_same_events_however_the_bytes_are_split(size: int) -> None:
    """Feeding the capture in pieces of any size yields its six data payloads."""
    parser = SSEParser()
    out = []
    for i in range(0, len(CAPTURE), size):
        out += parser.feed(CAPTURE[i : i + size])
    out += parser.close()
    assert len(out) == 6 and out[-1] == b"[DONE]" and out[0].startswith(b'{"id"')


def test_parser_handles_crlf_comments_and_multiline_data() -> None:
    """CRLF line ends, comment lines and multi-line data follow the SSE rules."""
    parser = SSEParser()
    assert parser.feed(b": keepalive\r\n\r\ndata: a\r\ndata:b\r\n\r\ndata: tail") == [b"a\nb"]
    assert parser.close() == [b"tail"]


def test_chunks_of_the_capture_are_classified() -> None:
    """Role chunk: no output; token chunks: output; finish; usage chunk; [DONE] is None."""
    chunks = [parse_chunk(p) for p in SSEParser().feed(CAPTURE)]
    assert chunks[0] == Chunk()
    assert chunks[1] == Chunk(output=True, content=True, tokens=1)
    assert chunks[3] == Chunk(output=True, content=True, tokens=1, finish_reason="length")
    assert chunks[4] is not None and chunks[4].usage is not None
    assert chunks[4].usage["completion_tokens"] == 3 and chunks[5] is None


def test_completions_text_tool_calls_and_errors_are_recognised() -> None:
    """Completions `text`, tool-call deltas and mid-stream error objects are understood."""
    text = parse_chunk(b'{"choices":[{"index":0,"text":"hi","finish_reason":null}]}')
    tool = parse_chunk(b'{"choices":[{"delta":{"tool_calls":[{"index":0}]},"finish_reason":null}]}')
    finish = parse_chunk(b'{"choices":[{"delta":{},"finish_reason":"stop"}]}')
    err = parse_chunk(b'{"error":{"message":"boom","code":500}}')
    one = Chunk(output=True, content=True, tokens=1)
    assert text == one and tool == one
    assert finish == Chunk(output=True, tokens=1, finish_reason="stop")
    assert err == Chunk(error="boom")
    with pytest.raises(ValueError):
        parse_chunk(b"not json")


def test_error_message_reads_openai_error_bodies() -> None:
    """The message of an OpenAI-style error body is extracted and shortened."""
    assert error_message({"error": {"message": "nope", "code": 404}}) == "nope"
    assert error_message("plain text") == "plain text"
    assert len(error_message({"error": {"message": "x" * 1000}})) == 300


def test_measurement_computes_ttft_itl_tpot_and_tokens() -> None:
    """Chunks read at known times give the expected TTFT, ITL, TPOT and usage tokens."""
    m = Measurement(start_ns=1_000_000_000)
    chunks = [parse_chunk(p) for p in SSEParser().feed(CAPTURE)]
    times_ms = [5, 50, 60, 80, 81]  # role chunk, three tokens, usage
    for chunk, t in zip(chunks, times_ms, strict=False):
        assert chunk is not None
        m.chunk(chunk, 1_000_000_000 + t * 1_000_000)
    m.end_ns = 1_000_000_000 + 82 * 1_000_000
    f = m.fields()
    assert f["ttft_ms"] == 50.0 and f["e2e_ms"] == 82.0
    assert (f["itl_p50_ms"], f["itl_p95_ms"], f["itl_max_ms"]) == (10.0, 20.0, 20.0)
    assert f["tpot_ms"] == 15.0 and f["output_chunks"] == 3
    assert (f["completion_tokens"], f["tokens_source"]) == (3, "usage")
    assert (f["prompt_tokens"], f["cached_tokens"], f["finish_reason"]) == (11, 0, "length")
    assert m.gaps_ns == [10_000_000, 20_000_000]


def test_measurement_without_usage_counts_the_tokens_chunks_carry() -> None:
    """Without usage, tokens are what the token chunks carry, empty-text ones included."""
    m = Measurement(0)
    frames = [
        b'{"choices":[{"index":0,"delta":{"role":"assistant","content":""}}]}',
        b'{"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}',
        b'{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null,"token_ids":[7,8]}]}',
        b'{"choices":[{"index":0,"delta":{"content":""},"finish_reason":"stop"}]}',
    ]
    for i, payload in enumerate(frames):
        chunk = parse_chunk(payload)
        assert chunk is not None
        m.chunk(chunk, (i + 1) * 1_000_000)
    f = m.fields()
    assert (f["completion_tokens"], f["tokens_source"], f["output_chunks"]) == (4, "chunks", 3)
    assert f["ttft_ms"] == 2.0  # the first token chunk, though its text is empty


def test_measurement_of_a_whole_body_has_no_ttft() -> None:
    """A non-streamed body gives usage tokens and finish reason, and no TTFT or ITL."""
    m = Measurement(0)
    m.body({"choices": [{"finish_reason": "length"}], "usage": {"completion_tokens": 9}})
    f = m.fields()
    assert f["ttft_ms"] is None and f["itl_p50_ms"] is None and f["tpot_ms"] is None
    assert (f["completion_tokens"], f["finish_reason"]) == (9, "length")
