"""Classifying a request into a lane: ordered explicit rules, first match wins.

Pure: takes the request's attributes, returns the lane and what decided it
(``class_source``: a header rule, another rule, a learned client, or the default).
Prompt size is an
estimate of ~4 characters per token over the text the request carries
(``obs.openai_api``: messages' text content, or the completion prompt), plus what the chat
template renders into the prompt besides it (``tools`` and ``functions`` declared, the tool
calls' arguments in the messages, ``documents``) and one token per token id of a token-id
prompt (flat or nested, one list per prompt); on English and code
this is within about +-30% of a BPE tokenizer's count, enough to tell a
200-token chat turn from a 4,000-token document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from obs import openai_api
from obs.config import Config, Lane
from obs.matching import Match

CHARS_PER_TOKEN = 4
_ROLE_CHARS = 8  # role and template tokens of one message, in characters
_TOOL_ROLES = frozenset({"tool", "function"})
# Request fields a chat template renders into the prompt (vLLM's tools, legacy functions,
# and the documents of a retrieval template).
_TEMPLATE_FIELDS = ("tools", "functions", "documents")

# class_source values: what put the request in its lane.
HEADER, RULE, LEARNED, DEFAULT = "header", "rule", "learned", "default"


@dataclass(frozen=True, slots=True)
class RequestAttrs:
    route: str
    model: str | None
    stream: bool
    headers: Mapping[str, str]  # lower-case names
    tenant: str | None
    max_tokens: int | None
    prompt_tokens: int | None  # estimated; None when no rule needs it
    tools: bool = False  # tools declared, or tool calls / results in the messages
    context_in: str = "last"  # where most of the prompt's text sits: earlier | last
    prefix_seen: bool = False  # its prefix fingerprint was seen from a recent request
    n: int = 1
    response_format: str = "text"
    slow_reader: bool = False  # the client was learned to read slowly


@dataclass(frozen=True, slots=True)
class PromptShape:
    """What a request's messages say, read in one pass (``prompt_shape``)."""

    tokens: int  # estimated prompt tokens, as ``estimate_prompt_tokens``
    context_in: str  # "earlier" when the messages before the last hold most of the text
    tools: bool


def prompt_shape(body: Mapping[str, Any]) -> PromptShape:
    """Prompt size, where its text sits and whether it is a tool loop, in one pass.

    ``tools`` is true when the request declares ``tools`` (or the legacy ``functions``), or a
    message is a tool result (role ``tool``/``function``) or carries ``tool_calls``: every
    request of an agent's tool loop does one or the other. ``context_in`` is ``earlier`` when
    the messages before the last hold more text than the last one (a document in the system
    message or an earlier turn, a short question last: how retrieval-augmented requests are
    built), else ``last`` (one long user message; a completion prompt).
    """
    tools = bool(body.get("tools")) or bool(body.get("functions"))
    # Rendered into the prompt by the chat template, before the messages.
    chars = sum(_json_chars(body.get(k)) for k in _TEMPLATE_FIELDS)
    last = 0
    for m in openai_api.messages(body) or []:
        if not tools and (
            m.get("role") in _TOOL_ROLES or m.get("tool_calls") or m.get("function_call")
        ):
            tools = True
        last = sum(len(t) for t in openai_api.content_texts(m.get("content"))) + _ROLE_CHARS
        last += _json_chars(m.get("tool_calls")) + _json_chars(m.get("function_call"))
        chars += last
    strings = openai_api.prompt_strings(body)
    if strings is not None:
        chars += sum(len(p) for p in strings)
        last = chars  # a completion prompt is all "last"
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        chars += CHARS_PER_TOKEN * _token_ids(prompt)  # token ids, flat or one list per prompt
        last = chars
    context_in = "earlier" if chars - last > last else "last"
    return PromptShape(max(1, chars // CHARS_PER_TOKEN), context_in, tools)


def _json_chars(value: Any) -> int:
    """About how many characters ``value`` takes as JSON: its strings' (keys too) lengths and
    a few per other scalar. Iterative: a deeply nested value cannot exhaust the stack."""
    n, todo = 0, [value]
    while todo:
        v = todo.pop()
        if isinstance(v, str):
            n += len(v) + 2
        elif isinstance(v, dict):
            n += sum(len(k) + 3 for k in v if isinstance(k, str))
            todo.extend(v.values())
        elif isinstance(v, list):
            todo.extend(v)
        elif v is not None:
            n += 4
    return n


def _token_ids(prompt: list[Any]) -> int:
    """Token ids in a prompt list: ints, or lists of ints (a batch of token-id prompts)."""
    flat = sum(isinstance(p, int) for p in prompt)
    return flat + sum(sum(isinstance(t, int) for t in p) for p in prompt if isinstance(p, list))


def response_format(body: Mapping[str, Any]) -> str:
    """``response_format.type`` of the request; ``text`` when it names none."""
    rf = body.get("response_format")
    t = rf.get("type") if isinstance(rf, dict) else None
    return t if isinstance(t, str) else "text"


def estimate_prompt_tokens(body: Mapping[str, Any]) -> int:
    """Approximate prompt tokens from the text in a chat or completions request body."""
    return prompt_shape(body).tokens


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
    if rule.max_max_tokens is not None and mt > rule.max_max_tokens:
        return False
    return _shape_matches(rule, a)


def _shape_matches(rule: Match, a: RequestAttrs) -> bool:
    if rule.tools is not None and rule.tools != a.tools:
        return False
    if rule.context_in is not None and rule.context_in != a.context_in:
        return False
    if rule.prefix_seen is not None and rule.prefix_seen != a.prefix_seen:
        return False
    if rule.min_n is not None and a.n < rule.min_n:
        return False
    if rule.response_format is not None and a.response_format not in rule.response_format:
        return False
    return rule.slow_reader is None or rule.slow_reader == a.slow_reader


def _source(rule: Match) -> str:
    if rule.header is not None:
        return HEADER
    return LEARNED if rule.slow_reader else RULE


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
        # What the relay must compute for these rules (each costs CPU per request).
        self.needs_shape = any(
            r.tools is not None or r.context_in is not None for _, r in self.rules
        )
        self.needs_prefix = any(r.prefix_seen is not None for _, r in self.rules)
        self.needs_slow_reader = any(r.slow_reader is not None for _, r in self.rules)
        # Header rules first (a client or gateway that names its class is believed), then the
        # others; within each, lane by lane in file order.
        ordered = sorted(self.rules, key=lambda lr: lr[1].header is None)
        self._sources = [(lane, rule, _source(rule)) for lane, rule in ordered]

    def classify(self, a: RequestAttrs) -> Lane:
        return self.decide(a)[0]

    def decide(self, a: RequestAttrs) -> tuple[Lane, str]:
        """The lane and its ``class_source``: header, rule, learned or default."""
        for lane, rule, source in self._sources:
            if _matches(rule, a):
                return lane, source
        return self.default, DEFAULT


def matches(rule: Match, a: RequestAttrs) -> bool:
    """True when every attribute ``rule`` names matches the request (a priority rule too)."""
    return _matches(rule, a)
