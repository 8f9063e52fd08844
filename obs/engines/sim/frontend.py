"""The API server's CPU: one Python process that takes requests in and streams every token out.

vLLM's OpenAI server runs in one process on one CPU (vLLM issue #12705), apart from the
engine core's process (PR #6883), so its work overlaps the GPU's steps. Its event loop
does its work in order: parsing each new request and building the engine's request, and,
after every step, detokenising each sampled token and framing it as an SSE chunk. The
prompt's tokenisation runs beside the loop, on the renderer's worker thread (vLLM 0.32,
``vllm/renderers/base.py``), one prompt after another. So a burst of requests is taken in
concurrently with the streaming: each waits for the loop's per-request work of those
before it and for the tokeniser's work on the prompts before it, not for their sum; and a
busy loop delays a token on its way out, behind the other tokens of its step.

:class:`FrontEndCost` holds the costs (docs/sim.md, "The API server", has their sources);
:class:`FrontEnd` is the loop's and the tokeniser's queues: when each is free, and when
the work just handed to it is done. Pure and clock-free: callers pass the times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# vLLM PR #15137 (its "before" run, a streamed serving benchmark): one API server process
# carried 14,791 output tokens/s (73.65 requests/s), so a token costs it at most 1/14,791 s,
# intake included.
TOKEN_S: Final = 1 / 14791
# A prompt is tokenised on the renderer's worker thread (vLLM 0.32 vllm/renderers/base.py:
# ``make_async(self._tokenize_prompt, executor=self._executor)``, a ThreadPoolExecutor of
# ``--renderer-num-workers`` = 1), not on the server's event loop: Hugging Face's Rust
# tokenizer releases the GIL, so a burst's prompts are tokenised one after another on that
# thread while the loop takes in the next requests and streams tokens. Its speed: "less than
# 20 seconds to tokenize a GB of text on a server's CPU" (huggingface/tokenizers README),
# about 12 M tokens/s over a server's cores; 2 us per token on one thread. (The 10-21 us per
# token tenstorrent/tt-inference-server #2173 measured for short chat prompts is mostly the
# chat template's fixed cost, here part of ``request_s``.)
PROMPT_TOKEN_S: Final = 2e-6
# The chat template is rendered on the same thread (vllm/renderers/hf.py:
# ``make_async(safe_apply_chat_template, executor=self._executor)``): about half a
# millisecond, what tenstorrent/tt-inference-server #2173's 10-21 us per token come to for
# its short (30-50 token) chat prompts, template and encode together.
RENDER_S: Final = 0.5e-3


REQUESTS_S: Final = 73.65  # the same run's requests per second


@dataclass(frozen=True, slots=True)
class FrontEndCost:
    """CPU seconds the API server spends per request and per prompt token taken in and per
    token streamed, and the latency each request pays outside that queue (``fixed_s``:
    the HTTP exchange, the hand-over to the engine core's process and back)."""

    prompt_token_s: float = PROMPT_TOKEN_S
    token_s: float = TOKEN_S
    request_s: float = 0.0
    fixed_s: float = 0.0
    render_s: float = 0.0  # the chat template, on the tokeniser's thread

    @classmethod
    def split(cls, request_s: float, fixed_s: float = 0.0) -> FrontEndCost:
        """PR #15137's one-process budget (73.65 requests and 14,791 tokens in one second)
        split: ``request_s`` per request, the rest of the second over its tokens."""
        left = max(0.0, 1.0 - REQUESTS_S * (request_s + RENDER_S))
        return cls(token_s=left / 14791, request_s=request_s, fixed_s=fixed_s, render_s=RENDER_S)

    def intake_seconds(self, prompt_tokens: int) -> float:
        return self.request_s + self.prompt_token_s * prompt_tokens


class FrontEnd:
    """One API server process: its event loop's work is done in the order it arrives, and
    its tokeniser thread's (the prompts) likewise, beside it."""

    def __init__(self, cost: FrontEndCost | None = None) -> None:
        self.cost = cost or FrontEndCost()
        self.free_at = 0.0  # the event loop
        self.tokenizer_free_at = 0.0  # the renderer's worker thread
        self.busy_s = 0.0  # CPU seconds of work done (for utilisation)

    def intake(self, now: float, prompt_tokens: int) -> float:
        """A request reached the server at ``now``: when the engine gets it. The loop
        parses it (``request_s``), the tokeniser thread renders and tokenises its prompt
        after that and after the prompts before it; the loop is free for other work
        meanwhile."""
        loop_work = self.cost.request_s
        tokens_work = self.cost.render_s + self.cost.prompt_token_s * prompt_tokens
        self.busy_s += loop_work + tokens_work
        self.free_at = max(now, self.free_at) + loop_work
        self.tokenizer_free_at = max(self.free_at, self.tokenizer_free_at) + tokens_work
        return self.tokenizer_free_at + self.cost.fixed_s

    def stream(self, start: float, step_s: float, steps: int, tokens_per_step: int) -> float:
        """``steps`` steps of ``step_s`` from ``start`` each sampled ``tokens_per_step``
        tokens, handed over as each step ends: when the last step's tokens are out."""
        work = tokens_per_step * self.cost.token_s
        self.busy_s += steps * work
        end = start + steps * step_s
        # Step i's tokens are handed over at start + i * step_s; the queue is done with the
        # last step's at the latest of: the old backlog plus all the work, the last step's
        # own work after its end, or all the work after the first step's end.
        self.free_at = max(self.free_at + steps * work, end + work, start + step_s + steps * work)
        return self.free_at
