"""The workload mix: six request classes, each with a weight and a shape.

Spec (YAML) -> model (this module). The shipped ``default_mix.yaml`` holds every
default, so the defaults live in one place: a user's mix overlays it (the
fields it gives replace the defaults; a class it leaves out gets weight 0), and
``--set CLASS.FIELD=VALUE`` overrides apply last. Unknown keys are errors, and
every error names the source and the field.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from copy import deepcopy
from pathlib import Path
from typing import Annotated, Any, Literal, TypeVar

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from obs.config import validation_error
from obs.errors import ConfigError

# The request classes, in the order reports list them. They are also the
# ``X-Client-Class`` header values the shipped lanes config routes on.
CLASS_NAMES = ("chat", "rag", "long-prefill", "agent", "batch", "slow-stream")

T = TypeVar("T", int, float)


def _pair(v: object) -> object:
    """A single number stands for the range [n, n]."""
    if isinstance(v, int | float) and not isinstance(v, bool):
        return (v, v)
    return v


def _ordered(v: tuple[T, T]) -> tuple[T, T]:
    if v[0] > v[1]:
        raise ValueError(f"range [{v[0]}, {v[1]}] has min > max")
    return v


PositiveInt = Annotated[int, Field(ge=1)]
NonNegFloat = Annotated[float, Field(ge=0)]
# [min, max], drawn uniformly; one number n means [n, n].
IntRange = Annotated[
    tuple[PositiveInt, PositiveInt], BeforeValidator(_pair), AfterValidator(_ordered)
]
SecondsRange = Annotated[
    tuple[NonNegFloat, NonNegFloat], BeforeValidator(_pair), AfterValidator(_ordered)
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ClassSpec(_Model):
    """Shape shared by every class: how often, how long in, how long out."""

    weight: NonNegFloat
    prompt_tokens: IntRange
    max_tokens: IntRange
    stream: bool
    # The X-Client-Class header value; null means the class name.
    client_class: str | None = None


class RagSpec(ClassSpec):
    """RAG: a shared document prefix (one of ``documents``) plus a short question."""

    documents: PositiveInt
    document_tokens: IntRange


class AgentSpec(ClassSpec):
    """Agent loop: ``turns`` requests over a context that grows each turn."""

    context_tokens: IntRange
    turns: IntRange
    think_time_s: SecondsRange
    # Tool definitions every turn declares (OpenAI function tools), as agent frameworks send.
    tools: Annotated[int, Field(ge=0)]


class SlowStreamSpec(ClassSpec):
    """A streamed answer read at a limited rate (bytes or SSE events per second)."""

    read_bytes_per_s: Annotated[float, Field(gt=0)] | None
    read_events_per_s: Annotated[float, Field(gt=0)] | None
    read_chunk_bytes: PositiveInt

    @model_validator(mode="after")
    def _one_rate(self) -> SlowStreamSpec:
        if (self.read_bytes_per_s is None) == (self.read_events_per_s is None):
            raise ValueError("give exactly one of read_bytes_per_s and read_events_per_s")
        if not self.stream:
            raise ValueError("stream must be true: a slow reader reads a stream")
        return self


class Classes(_Model):
    chat: ClassSpec
    rag: RagSpec
    long_prefill: ClassSpec = Field(alias="long-prefill")
    agent: AgentSpec
    batch: ClassSpec
    slow_stream: SlowStreamSpec = Field(alias="slow-stream")


class RequestOptions(_Model):
    """Options every request gets."""

    include_usage: bool
    ignore_eos: bool
    temperature: NonNegFloat | None


class Mix(_Model):
    """A validated workload mix."""

    version: Literal[1]
    request: RequestOptions
    classes: Classes

    @model_validator(mode="after")
    def _some_weight(self) -> Mix:
        if not self.weights():
            raise ValueError("every class has weight 0: give at least one a positive weight")
        return self

    def spec(self, name: str) -> ClassSpec:
        """The spec of class ``name`` (one of :data:`CLASS_NAMES`)."""
        if name not in CLASS_NAMES:
            raise KeyError(name)
        spec: ClassSpec = getattr(self.classes, name.replace("-", "_"))
        return spec

    def weights(self) -> dict[str, float]:
        """Classes with a positive weight, in :data:`CLASS_NAMES` order."""
        out = {}
        for name in CLASS_NAMES:
            w = getattr(self.classes, name.replace("-", "_")).weight
            if w > 0:
                out[name] = w
        return out

    def header_value(self, name: str) -> str:
        """The ``X-Client-Class`` value requests of class ``name`` send."""
        return self.spec(name).client_class or name


def default_mix_path() -> Path:
    """The shipped default mix (package data)."""
    return Path(__file__).parent / "default_mix.yaml"


def _read_yaml(path: Path) -> object:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{path}: cannot read mix: {e.strerror or e}") from e
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ConfigError(f"{path}: not valid YAML: {e}") from e


def _merge(base: dict[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """``top`` deep-merged over ``base`` (mappings merge, anything else replaces)."""
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = deepcopy(value)
    return out


def overlay(user: object, source: str = "<mix>") -> dict[str, Any]:
    """The default mix with ``user`` (loaded YAML) laid over it; unlisted classes get weight 0."""
    defaults = _read_yaml(default_mix_path())
    assert isinstance(defaults, dict)
    if user is None:
        return defaults
    if not isinstance(user, Mapping):
        raise ConfigError(f"{source}: a mix is a mapping with a 'classes' key")
    classes = user.get("classes")
    if classes is not None and not isinstance(classes, Mapping):
        raise ConfigError(f"{source}: classes: expected a mapping of class name to fields")
    for name in defaults["classes"]:
        if classes is not None and name not in classes:
            defaults["classes"][name]["weight"] = 0
    return _merge(defaults, user)


def apply_sets(data: dict[str, Any], sets: Sequence[str]) -> dict[str, Any]:
    """Apply ``CLASS.FIELD=VALUE`` (or ``request.FIELD=VALUE``) overrides; VALUE is YAML."""
    out = deepcopy(data)
    for item in sets:
        key, sep, raw = item.partition("=")
        path = [p for p in key.strip().split(".") if p]
        if not sep or len(path) < 2:
            raise ConfigError(f"--set {item!r}: expected CLASS.FIELD=VALUE, e.g. chat.weight=5")
        try:
            value = yaml.safe_load(raw)
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item!r}: value is not valid YAML: {e}") from e
        if path[0] not in Mix.model_fields:  # chat.weight means classes.chat.weight
            path = ["classes", *path]
        node = out
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = node[part] = {}
            node = child
        node[path[-1]] = value
    return out


def parse_mix(data: object, source: str = "<mix>") -> Mix:
    """Validate complete mix data (see :func:`overlay`); errors name ``source`` and each field."""
    try:
        return Mix.model_validate(data)
    except ValidationError as e:
        raise validation_error(source, "mix", e) from e


def load_mix(path: str | Path | None = None, sets: Sequence[str] = ()) -> Mix:
    """The mix in ``path`` (or the default mix) with ``--set`` overrides applied."""
    source = str(path) if path is not None else str(default_mix_path())
    user = _read_yaml(Path(path)) if path is not None else None
    data = apply_sets(overlay(user, source), sets)
    if sets:
        source += " with --set " + " ".join(sets)
    return parse_mix(data, source)
