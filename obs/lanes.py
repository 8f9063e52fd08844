"""Classifying a request into a lane: ordered explicit rules, first match wins.

Pure: takes the request's attributes, returns the lane. Prompt size is an
estimate of ~4 characters per token over the text the request carries
(``obs.openai_api``: messages' text content, or the completion prompt); on English and code
this is within about +-30% of a BPE tokenizer's count, enough to tell a
200-token chat turn from a 4,000-token document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from obs import openai_api
from obs.config import Config, Lane, Match

CHARS_PER_TOKEN = 4


@dataclass(frozen=True, slots=True)
class RequestAttrs:
    route: str
    model: str | None
    stream: bool
    headers: Mapping[str, str]  # lower-case names
    tenant: str | None
    max_tokens: int | None
    prompt_tokens: int | None  # estimated; None when no rule needs it


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Approximate prompt tokens from the text in a chat or completions request body."""
    chars = 0
    for m in openai_api.messages(body) or []:
        chars += sum(len(t) for t in openai_api.content_texts(m.get("content")))
        chars += 8  # role and template tokens
    chars += sum(len(p) for p in openai_api.prompt_strings(body) or [])
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        chars += CHARS_PER_TOKEN * sum(isinstance(p, int) for p in prompt)  # token ids
    return max(1, chars // CHARS_PER_TOKEN)


def _matches(rule: Match, a: RequestAttrs) -> bool:
    if rule.route is not None and rule.route != a.route:
        return False
    if rule.model is not None and rule.model != a.model:
        return False
    if rule.stream is not None and rule.stream != a.stream:
        return False
    if rule.tenant is not None and rule.tenant != a.tenant:
        return False
    if rule.header is not None:
        for k, v in rule.header.items():
            if a.headers.get(k.lower()) != v:
                return False
    pt = a.prompt_tokens or 0
    if rule.min_prompt_tokens is not None and pt < rule.min_prompt_tokens:
        return False
    if rule.max_prompt_tokens is not None and pt > rule.max_prompt_tokens:
        return False
    mt = a.max_tokens or 0
    if rule.min_max_tokens is not None and mt < rule.min_max_tokens:
        return False
    return not (rule.max_max_tokens is not None and mt > rule.max_max_tokens)


class Classifier:
    """Maps request attributes to a lane of ``config``."""

    def __init__(self, config: Config) -> None:
        self.config = config
        self.default = config.lane(config.default_lane)
        self.rules = [(lane, rule) for lane in config.lanes for rule in lane.match]
        self.needs_prompt_tokens = any(
            r.min_prompt_tokens is not None or r.max_prompt_tokens is not None
            for _, r in self.rules
        )
        self.headers = sorted({k.lower() for _, r in self.rules for k in (r.header or {})})

    def classify(self, a: RequestAttrs) -> Lane:
        for lane, rule in self.rules:
            if _matches(rule, a):
                return lane
        return self.default


def matches(rule: Match, a: RequestAttrs) -> bool:
    """True when every attribute ``rule`` names matches the request (a priority rule too)."""
    return _matches(rule, a)
