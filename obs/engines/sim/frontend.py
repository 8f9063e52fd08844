"""The API server's CPU: one Python process that takes requests in and streams every token out.

vLLM's OpenAI server runs in one process on one CPU (vLLM issue #12705), apart from the
engine core's process (PR #6883), so its work overlaps the GPU's steps but is done in
order: a new request is parsed, templated and tokenised before the engine sees it, and
after every step each sampled token is detokenised and framed as an SSE chunk before its
client gets it. A busy front end therefore delays a request twice: on the way in, behind
the tokens of the step before, and on the way out, behind the other tokens of its step.

:class:`FrontEndCost` holds the two costs (docs/sim.md, "The API server", has their
sources); :class:`FrontEnd` is the one CPU's queue: when it is free, and when the work
just handed to it is done. Pure and clock-free: callers pass the times.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

# vLLM PR #15137 (its "before" run, a streamed serving benchmark): one API server process
# carried 14,791 output tokens/s (73.65 requests/s), so a token costs it at most 1/14,791 s,
# intake included.
TOKEN_S: Final = 1 / 14791
# tenstorrent/tt-inference-server #2173: a Hugging Face tokenizer's encode of a short chat
# prompt, template applied, measured at 10-21 us per token; the low end.
PROMPT_TOKEN_S: Final = 10e-6


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

    @classmethod
    def split(cls, request_s: float, fixed_s: float = 0.0) -> FrontEndCost:
        """PR #15137's one-process budget (73.65 requests and 14,791 tokens in one second)
        split: ``request_s`` per request, the rest of the second over its tokens."""
        left = max(0.0, 1.0 - REQUESTS_S * request_s)
        return cls(token_s=left / 14791, request_s=request_s, fixed_s=fixed_s)

    def intake_seconds(self, prompt_tokens: int) -> float:
        return self.request_s + self.prompt_token_s * prompt_tokens


class FrontEnd:
    """One API server process: its work is done in the order it arrives."""

    def __init__(self, cost: FrontEndCost | None = None) -> None:
        self.cost = cost or FrontEndCost()
        self.free_at = 0.0
        self.busy_s = 0.0  # CPU seconds of work done (for utilisation)

    def intake(self, now: float, prompt_tokens: int) -> float:
        """A request reached the server at ``now``: when the engine gets it."""
        work = self.cost.intake_seconds(prompt_tokens)
        self.busy_s += work
        self.free_at = max(now, self.free_at) + work
        return self.free_at + self.cost.fixed_s

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
