"""The load plan: which requests to send and when, from a mix and a seed. Pure.

A plan is a sequence of *sessions*. A session is one request, except for the
``agent`` class, where it is a conversation of several turns. Open loop, sessions
arrive as a Poisson process at ``rate`` per second (with optional bursts);
closed loop, a fixed number of workers each run one session after another, so
offsets are 0. Within a session, turn ``k > 0`` is sent ``think_s`` after turn
``k - 1`` ended: the driver enforces that, because it depends on the server.

The same mix, seed and arrivals give the same plan. Each aspect draws from its
own random stream (arrivals, class choice, one stream per class for shapes), so
changing one class's lengths does not move the arrivals or the class sequence.
Prompt text is not part of the plan: :mod:`obs.loadgen.prompts` derives it.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from obs.errors import ConfigError
from obs.loadgen.mix import AgentSpec, Mix, RagSpec


@dataclass(frozen=True, slots=True)
class Burst:
    """From ``every_s`` on, every ``every_s`` seconds: ``factor`` x the rate for ``length_s``."""

    every_s: float
    length_s: float
    factor: float

    def __post_init__(self) -> None:
        if not 0 < self.length_s < self.every_s:
            raise ConfigError(
                f"burst: length_s must be positive and below every_s, got {self.length_s}"
                f" and {self.every_s}"
            )
        if self.factor <= 0:
            raise ConfigError(f"burst: factor must be positive, got {self.factor}")

    def active(self, t: float) -> bool:
        """Whether offset ``t`` (seconds) falls in a burst window."""
        return t >= self.every_s and (t % self.every_s) < self.length_s


@dataclass(frozen=True, slots=True)
class Arrivals:
    """Open loop (``rate`` sessions/s, Poisson) or closed loop (``concurrency`` workers)."""

    rate: float | None = None
    concurrency: int | None = None
    burst: Burst | None = None

    def __post_init__(self) -> None:
        if (self.rate is None) == (self.concurrency is None):
            raise ConfigError("arrivals: give exactly one of rate (open loop) or concurrency")
        if self.rate is not None and self.rate <= 0:
            raise ConfigError(f"arrivals: rate must be positive, got {self.rate}")
        if self.concurrency is not None and self.concurrency < 1:
            raise ConfigError(f"arrivals: concurrency must be >= 1, got {self.concurrency}")
        if self.burst is not None and self.rate is None:
            raise ConfigError("arrivals: bursts need an open-loop rate")

    @property
    def closed(self) -> bool:
        return self.concurrency is not None


# Sent with every request as RUN_ID-SESSION: one conversation's identity (a split lane sticky
# by tenant, with auth.tenant_header naming this header, keeps each session on one arm).
SESSION_HEADER = "X-Vllm-Obs-Session"


@dataclass(frozen=True, slots=True)
class PlannedRequest:
    """One request to send. Lengths are tokens; text comes from the prompt builder."""

    index: int  # position in the plan; the request id derives from it
    client_class: str
    session: int  # sessions count from 0; an agent conversation is one session
    turn: int  # 0-based turn in the session
    offset_s: float  # open loop: the session's arrival after the start; closed loop: 0
    think_s: float  # turn > 0: wait this long after the previous turn ended
    prompt_tokens: int  # the request's own new text (whole prompt, question, turn message)
    max_tokens: int
    stream: bool
    document: int | None = None  # rag: which shared document is the prefix
    prefix_tokens: int = 0  # rag: the document's length; agent: the shared context's
    history: tuple[tuple[int, int], ...] = ()  # agent: (user, assistant) tokens of past turns

    @property
    def total_prompt_tokens(self) -> int:
        """Planned prompt length, all messages together (chat-template tokens not counted)."""
        return self.prefix_tokens + sum(u + a for u, a in self.history) + self.prompt_tokens


def poisson_offsets(rate: float, rng: random.Random, burst: Burst | None = None) -> Iterator[float]:
    """Arrival offsets (s) of a Poisson process; with bursts, thinned from the peak rate."""
    peak = rate * max(1.0, burst.factor) if burst else rate
    t = 0.0
    while True:
        t += rng.expovariate(peak)
        if burst is None:
            yield t
            continue
        here = rate * (burst.factor if burst.active(t) else 1.0)
        if rng.random() * peak < here:
            yield t


def document_lengths(mix: Mix, seed: int) -> tuple[int, ...]:
    """Token length of each shared rag document."""
    spec = mix.classes.rag
    rng = random.Random(f"{seed}:documents")
    return tuple(_draw(rng, spec.document_tokens) for _ in range(spec.documents))


def iter_plan(mix: Mix, seed: int, arrivals: Arrivals) -> Iterator[PlannedRequest]:
    """The unbounded plan: planned requests, session by session."""
    weights = mix.weights()
    names, cum = list(weights), list(itertools.accumulate(weights.values()))
    rng_class = random.Random(f"{seed}:class")
    rng_shape = {name: random.Random(f"{seed}:shape:{name}") for name in names}
    docs = document_lengths(mix, seed)
    if arrivals.rate is not None:
        offsets: Iterator[float] = poisson_offsets(
            arrivals.rate, random.Random(f"{seed}:arrivals"), arrivals.burst
        )
    else:
        offsets = itertools.repeat(0.0)
    index = 0
    for session, offset in enumerate(offsets):
        name = rng_class.choices(names, cum_weights=cum)[0]
        for req in _session(mix, name, rng_shape[name], docs, session, round(offset, 6), index):
            yield req
            index += 1


def bounded(
    requests: Iterable[PlannedRequest],
    *,
    duration_s: float | None = None,
    max_requests: int | None = None,
) -> Iterator[PlannedRequest]:
    """Requests up to ``max_requests`` (turns count) whose session arrives before ``duration_s``."""
    for req in requests:
        if max_requests is not None and req.index >= max_requests:
            return
        if duration_s is not None and req.offset_s >= duration_s:
            return
        yield req


def plan(
    mix: Mix,
    seed: int,
    arrivals: Arrivals,
    *,
    duration_s: float | None = None,
    max_requests: int | None = None,
) -> list[PlannedRequest]:
    """The finite plan; closed loop needs ``max_requests``, open loop either bound."""
    if max_requests is None and (arrivals.closed or duration_s is None):
        raise ConfigError(
            "plan: unbounded; give max_requests"
            + ("" if arrivals.closed else " or duration_s")
            + " (a closed loop runs until its duration with iter_plan)"
        )
    reqs = bounded(iter_plan(mix, seed, arrivals), duration_s=duration_s, max_requests=max_requests)
    return list(reqs)


def sessions(requests: Iterable[PlannedRequest]) -> Iterator[list[PlannedRequest]]:
    """Group consecutive requests of the same session."""
    for _, group in itertools.groupby(requests, key=lambda r: r.session):
        yield list(group)


def _draw(rng: random.Random, bounds: tuple[int, int]) -> int:
    return rng.randint(bounds[0], bounds[1])


def _session(
    mix: Mix,
    name: str,
    rng: random.Random,
    docs: tuple[int, ...],
    session: int,
    offset: float,
    index: int,
) -> list[PlannedRequest]:
    spec = mix.spec(name)

    def request(
        turn: int = 0,
        think_s: float = 0.0,
        document: int | None = None,
        prefix_tokens: int = 0,
        history: tuple[tuple[int, int], ...] = (),
    ) -> PlannedRequest:
        return PlannedRequest(
            index=index + turn,
            client_class=name,
            session=session,
            turn=turn,
            offset_s=offset,
            think_s=think_s,
            prompt_tokens=_draw(rng, spec.prompt_tokens),
            max_tokens=_draw(rng, spec.max_tokens),
            stream=spec.stream,
            document=document,
            prefix_tokens=prefix_tokens,
            history=history,
        )

    if isinstance(spec, RagSpec):
        document = rng.randrange(len(docs))
        return [request(document=document, prefix_tokens=docs[document])]
    if isinstance(spec, AgentSpec):
        context = _draw(rng, spec.context_tokens)
        turns: list[PlannedRequest] = []
        history: tuple[tuple[int, int], ...] = ()
        for turn in range(_draw(rng, spec.turns)):
            think = round(rng.uniform(*spec.think_time_s), 6) if turn else 0.0
            req = request(turn, think, prefix_tokens=context, history=history)
            turns.append(req)
            # The next turn resends this one's message and (as if full length) its answer.
            history = (*history, (req.prompt_tokens, req.max_tokens))
        return turns
    return [request()]
