"""Opt-in capture of prompt and output text into the event, through a redaction hook.

Off by default: no prompt or output text reaches events, spans or logs. With
``--capture-text prompt|output|all`` the JSONL event gets ``prompt_text`` and/or
``output_text``, each passed through the redaction hook (``--redact-hook
MODULE:FUNCTION``, a ``str -> str`` callable; default :func:`redact`) and cut to
``--capture-max-chars``. Spans and logs never carry text.

The relay only keeps references on the hot path (the parsed request body, the
output frames as they went by); text is extracted and redacted once, when the
request ends. A hook that raises drops the text (the field says so) and never
the event, and nothing unredacted is ever written.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import orjson
import structlog

from obs.errors import ConfigError
from obs.events import Event
from obs.openai_api import content_texts, frame_data, prompt_text
from obs.sidecar import defaults as D

log = structlog.get_logger("vllm_obs.capture")

Redactor = Callable[[str], str]
KINDS = ("prompt", "output")
DEFAULT_MAX_CHARS = D.CAPTURE_MAX_CHARS
HOOK_FAILED = "[redaction hook failed: text dropped]"

# What the default hook masks: secrets and identifiers that commonly leak into prompts.
_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+"), "[email]"),
    (re.compile(r"(?i)\bbearer\s+[\w.~+/-]+=*"), "[token]"),
    (re.compile(r"\b(?:sk|pk|rk|api|key|ghp|gho|xox[abp])[-_][\w-]{12,}"), "[token]"),
    (re.compile(r"\beyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,}"), "[token]"),  # a JWT
    (re.compile(r"\b[0-9a-fA-F]{32,}\b"), "[token]"),
    (re.compile(r"(?<![\w.])\+?\d[\d \-().]{7,}\d(?![\w.])"), "[number]"),  # phone, card, IBAN
    (re.compile(r"\b\d{1,3}(?:\.\d{1,3}){3}\b"), "[ip]"),
)


def redact(text: str) -> str:
    """The default hook: masks e-mail addresses, tokens and keys, long numbers, IPv4s.

    A baseline, not a PII scrubber: an operator who captures text from real users
    should pass their own hook (``--redact-hook``).
    """
    for pattern, mask in _PATTERNS:
        text = pattern.sub(mask, text)
    return text


def load_hook(spec: str) -> Redactor:
    """``MODULE:FUNCTION`` -> the callable; a ConfigError that says what is wrong."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise ConfigError(f"--redact-hook: {spec!r} is not MODULE:FUNCTION, e.g. mycorp.pii:scrub")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ConfigError(f"--redact-hook: cannot import {module_name!r}: {err}") from err
    hook = getattr(module, attr, None)
    if not callable(hook):
        raise ConfigError(f"--redact-hook: {module_name!r} has no callable {attr!r}")
    return hook


@dataclass(frozen=True, slots=True)
class TextCapture:
    """Which texts to capture, the hook that redacts them, and the length cap."""

    prompt: bool = False
    output: bool = False
    redactor: Redactor = redact
    max_chars: int = DEFAULT_MAX_CHARS

    @classmethod
    def parse(cls, which: str | None, hook: str | None, max_chars: int) -> TextCapture | None:
        """From the CLI: ``which`` is None/none, prompt, output or all."""
        if which in (None, "none"):
            if hook:
                raise ConfigError("--redact-hook is only used with --capture-text")
            return None
        if max_chars <= 0:
            raise ConfigError(f"--capture-max-chars: {max_chars} must be positive")
        return cls(
            prompt=which in ("prompt", "all"),
            output=which in ("output", "all"),
            redactor=load_hook(hook) if hook else redact,
            max_chars=max_chars,
        )

    def describe(self) -> str:
        kinds = [k for k, on in zip(KINDS, (self.prompt, self.output), strict=True) if on]
        name = getattr(self.redactor, "__qualname__", repr(self.redactor))
        module = getattr(self.redactor, "__module__", "?")
        return f"{'+'.join(kinds)} (redacted by {module}:{name}, at most {self.max_chars} chars)"

    def fill(
        self,
        ev: Event,
        body: dict[str, Any] | None,
        frames: list[bytes] | None,
        whole: bytes | None,
    ) -> None:
        """Set the event's text fields from what the relay kept of this request."""
        if self.prompt and body is not None:
            ev.prompt_text = self._clean(prompt_text(body))
        if self.output:
            text = None
            if frames:
                text = stream_text(frames)
            elif whole is not None:
                text = body_text(whole)
            if text is not None:
                ev.output_text = self._clean(text)

    def _clean(self, text: str) -> str:
        try:
            out = self.redactor(text)
        except Exception:
            log.exception("redact_hook_failed")
            return HOOK_FAILED
        if not isinstance(out, str):
            log.error("redact_hook_failed", returned=type(out).__name__)
            return HOOK_FAILED
        return out[: self.max_chars]


def _choice_text(choice: Any, key: str) -> str:
    if not isinstance(choice, dict):
        return ""
    if isinstance(choice.get("text"), str):  # completions
        return str(choice["text"])
    part = choice.get(key)
    return "".join(content_texts(part.get("content"))) if isinstance(part, dict) else ""


def stream_text(frames: list[bytes]) -> str:
    """The output text of an SSE stream's frames (first choice's deltas, in order; a
    Responses API stream's ``response.output_text.delta`` events, a Messages API stream's
    ``text_delta`` blocks)."""
    out = []
    for frame in frames:
        payload = frame_data(frame)
        if payload is None:
            continue
        try:
            obj = orjson.loads(payload)
        except orjson.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        kind, delta = obj.get("type"), obj.get("delta")
        if kind == "response.output_text.delta" and isinstance(delta, str):
            out.append(delta)
            continue
        if kind == "content_block_delta" and isinstance(delta, dict):  # the Messages API
            if delta.get("type") == "text_delta" and isinstance(delta.get("text"), str):
                out.append(delta["text"])
            continue
        choices = obj.get("choices")
        if isinstance(choices, list):
            out += [_choice_text(c, "delta") for c in choices if _index(c) == 0]
    return "".join(out)


def body_text(data: bytes) -> str | None:
    """The output text of a whole (non-streamed) answer; None when it is not one."""
    try:
        obj = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if isinstance(obj, dict) and obj.get("object") == "response":  # the Responses API
        items = obj.get("output")
        return "".join(
            t
            for item in (items if isinstance(items, list) else ())
            if isinstance(item, dict) and item.get("type") == "message"
            for t in content_texts(item.get("content"))
        )
    if isinstance(obj, dict) and obj.get("type") == "message":  # the Messages API
        return "".join(content_texts([b for b in _list(obj.get("content")) if _is_text(b)]))
    choices = obj.get("choices") if isinstance(obj, dict) else None
    if not isinstance(choices, list) or not choices:
        return None
    return _choice_text(choices[0], "message")


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _is_text(block: Any) -> bool:
    return isinstance(block, dict) and block.get("type") == "text"


def _index(choice: Any) -> int:
    return choice.get("index", 0) if isinstance(choice, dict) else -1
