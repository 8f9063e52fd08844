"""What a replica runs (engine, version, the settings it reports) and what the sidecar runs.

Pure: the sidecar reads the engine's own pages (``/metrics``, ``/version``, llama.cpp's
``/props``, TGI's ``/info``, SGLang's ``/get_server_info``) and passes what it found in;
this module maps them to a small fixed set of engine-neutral setting names
(``SETTING_KEYS``), each value a short string. A setting the engine does not report is
absent, never an empty string, so an info series never flaps between "" and a value.

A :class:`Served` has a short fingerprint (8 hex digits) that every request event
carries (``settings_fingerprint``); :class:`ChangeTracker` remembers the last settings
seen per replica and yields a :class:`Change` when a replica comes back with others (a
restart without a change, or a replica going down and up, yields none).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from hashlib import blake2b
from typing import Any, Final

from obs.numerals import whole_number

# Engine-neutral setting names (label names of the info series, in this order).
VERSION: Final = "version"
BLOCK_SIZE: Final = "block_size"
PREFIX_CACHING: Final = "prefix_caching"
KV_CACHE_DTYPE: Final = "kv_cache_dtype"
KV_CACHE_TOKENS: Final = "kv_cache_tokens"
MAX_RUNNING: Final = "max_running"
MAX_BATCH_TOKENS: Final = "max_batch_tokens"
CONTEXT_TOKENS: Final = "context_tokens"
# Flags a pool declares it started its replicas with (obs.config.DeclaredEngine), named as
# the flags (vLLM reports none of them on /metrics). A declared prefix_caching shares the
# reported one's key: what the engine reports wins, and a disagreement is drift.
DECLARED_KEYS: Final = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "max_model_len",
    "long_prefill_token_threshold",
    "stream_interval",
    "max_num_partial_prefills",
    "max_long_partial_prefills",
)
# A declared flag -> the reported setting it must equal, where an engine reports that.
DRIFT_CHECKS: Final = {
    "max_num_seqs": MAX_RUNNING,
    "max_num_batched_tokens": MAX_BATCH_TOKENS,
    "max_model_len": CONTEXT_TOKENS,
    PREFIX_CACHING: PREFIX_CACHING,
}
SETTING_KEYS: Final = (
    VERSION,
    BLOCK_SIZE,
    PREFIX_CACHING,
    KV_CACHE_DTYPE,
    KV_CACHE_TOKENS,
    MAX_RUNNING,
    MAX_BATCH_TOKENS,
    CONTEXT_TOKENS,
    *DECLARED_KEYS,
)
MAX_VALUE_CHARS: Final = 64  # a longer value is cut: label values stay bounded
MAX_TEXT_CHARS: Final = 240  # the old/new text of a change

# vLLM's ``vllm:cache_config_info`` labels -> setting names.
VLLM_CACHE_CONFIG: Final = "vllm:cache_config_info"
_VLLM_CACHE_LABELS: Final = {
    "block_size": BLOCK_SIZE,
    "enable_prefix_caching": PREFIX_CACHING,
    "cache_dtype": KV_CACHE_DTYPE,
    "kv_cache_size_tokens": KV_CACHE_TOKENS,
}
# Each engine's JSON page: (path, {setting: key path in the JSON}).
SETTINGS_PAGES: Final[dict[str, tuple[str, dict[str, tuple[str, ...]]]]] = {
    "vllm": ("/version", {VERSION: ("version",)}),
    "sim": ("/version", {VERSION: ("version",)}),
    "llamacpp": (
        "/props",
        {
            VERSION: ("build_info",),
            MAX_RUNNING: ("total_slots",),
            CONTEXT_TOKENS: ("default_generation_settings", "n_ctx"),
        },
    ),
    "tgi": (
        "/info",
        {
            VERSION: ("version",),
            MAX_RUNNING: ("max_concurrent_requests",),
            MAX_BATCH_TOKENS: ("max_batch_total_tokens",),
            CONTEXT_TOKENS: ("max_total_tokens",),
        },
    ),
    "sglang": (
        "/get_server_info",
        {
            VERSION: ("version",),
            MAX_RUNNING: ("max_running_requests",),
            MAX_BATCH_TOKENS: ("chunked_prefill_size",),
            CONTEXT_TOKENS: ("context_length",),
            BLOCK_SIZE: ("page_size",),
            KV_CACHE_DTYPE: ("kv_cache_dtype",),
            PREFIX_CACHING: ("disable_radix_cache",),  # negated below
        },
    ),
}
# Pages only some replicas serve, read beside the one above: vLLM's /server_info answers
# only with VLLM_SERVER_DEV_MODE=1; then it reports its scheduler flags, named as declared.
_SCHEDULER: Final = ("vllm_config", "scheduler_config")
EXTRA_PAGES: Final[dict[str, tuple[str, dict[str, tuple[str, ...]]]]] = {
    "vllm": (
        "/server_info?config_format=json",
        {
            "max_num_seqs": (*_SCHEDULER, "max_num_seqs"),
            "max_num_batched_tokens": (*_SCHEDULER, "max_num_batched_tokens"),
            "long_prefill_token_threshold": (*_SCHEDULER, "long_prefill_token_threshold"),
            "stream_interval": (*_SCHEDULER, "stream_interval"),
            "max_model_len": ("vllm_config", "model_config", "max_model_len"),
        },
    ),
}
_ABSENT: Final = frozenset({"", "none", "null"})


def short_hash(text: str) -> str:
    """8 hex digits of a BLAKE2b hash: the fingerprints events and series carry."""
    return blake2b(text.encode(), digest_size=4).hexdigest()


def value_text(value: object) -> str | None:
    """A setting's value as a bounded string; ``None`` for what means "not reported"."""
    if value is None or isinstance(value, (dict, list)):
        return None
    text = str(value).strip() if not isinstance(value, bool) else str(value).lower()
    if text.lower() in _ABSENT:
        return None
    if text in ("True", "False"):
        text = text.lower()
    return text[:MAX_VALUE_CHARS]


@dataclass(frozen=True, slots=True)
class Served:
    """The engine a replica runs and the settings it reports (absent keys left out)."""

    engine: str
    settings: tuple[tuple[str, str], ...] = ()
    # Read by every request's event (its replica's settings): worked out once, here.
    fingerprint: str = field(init=False, repr=False, compare=False)
    max_running: int | None = field(init=False, repr=False, compare=False)  # its slots

    def __post_init__(self) -> None:
        text = self.engine + "".join(f"|{k}={v}" for k, v in self.settings)
        object.__setattr__(self, "fingerprint", short_hash(text))
        settings = dict(self.settings)
        slots = settings.get("max_num_seqs") or settings.get(MAX_RUNNING) or ""
        object.__setattr__(self, "max_running", whole_number(slots))

    @classmethod
    def of(cls, engine: str, values: Mapping[str, object]) -> Served:
        """Only known setting names, only values that say something, in ``SETTING_KEYS`` order."""
        kept = {k: value_text(values.get(k)) for k in SETTING_KEYS}
        return cls(engine, tuple((k, v) for k, v in kept.items() if v is not None))

    def as_dict(self) -> dict[str, str]:
        return {"engine": self.engine, **dict(self.settings)}


def vllm_cache_settings(labels: Mapping[str, str]) -> dict[str, str]:
    """Setting names and values from ``vllm:cache_config_info``'s labels."""
    return {name: labels[label] for label, name in _VLLM_CACHE_LABELS.items() if label in labels}


def page_settings(
    engine: str,
    page: object,
    pages: Mapping[str, tuple[str, dict[str, tuple[str, ...]]]] = SETTINGS_PAGES,
) -> dict[str, object]:
    """Setting names and values from the engine's JSON settings page (``SETTINGS_PAGES``, or
    ``EXTRA_PAGES``)."""
    if engine not in pages or not isinstance(page, dict):
        return {}
    out: dict[str, object] = {}
    for name, path in pages[engine][1].items():
        value: Any = page
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if value is not None:
            out[name] = value
    if engine == "sglang" and isinstance(out.get(PREFIX_CACHING), bool):
        out[PREFIX_CACHING] = not out[PREFIX_CACHING]  # its flag disables the cache
    return out


@dataclass(frozen=True, slots=True)
class Change:
    """A replica (or the sidecar's config) now runs other settings: what changed, old and new."""

    key: tuple[str, str]
    changed: tuple[str, ...]
    old: str
    new: str


def change_between(key: tuple[str, str], old: Served, new: Served) -> Change | None:
    """The change from ``old`` to ``new`` (only the settings that differ), or ``None``."""
    if old.fingerprint == new.fingerprint:
        return None
    a, b = old.as_dict(), new.as_dict()
    changed = tuple(k for k in ("engine", *SETTING_KEYS) if a.get(k) != b.get(k))

    def text(values: dict[str, str]) -> str:
        return " ".join(f"{k}={values.get(k, '-')}" for k in changed)[:MAX_TEXT_CHARS]

    return Change(key, changed, text(a), text(b))


@dataclass(slots=True)
class ChangeTracker:
    """The last settings seen per key and the last change of each (bounded by the keys)."""

    last: dict[tuple[str, str], Served] = field(default_factory=dict)
    changes: dict[tuple[str, str], tuple[Change, float]] = field(default_factory=dict)

    def observe(self, key: tuple[str, str], served: Served, now_s: float) -> Change | None:
        """Record what ``key`` runs now; the change from the last settings seen, if any."""
        previous = self.last.get(key)
        self.last[key] = served
        change = None if previous is None else change_between(key, previous, served)
        if change is not None:
            self.changes[key] = (change, now_s)
        return change


def merge(engine: str, pages: Iterable[Mapping[str, object]]) -> Served:
    """One :class:`Served` from the settings several pages gave (the first page wins a key)."""
    values: dict[str, object] = {}
    for page in pages:
        for k, v in page.items():
            if value_text(v) is not None:
                values.setdefault(k, v)
    return Served.of(engine, values)


def drift(reported: Mapping[str, object], declared: Mapping[str, object]) -> dict[str, bool]:
    """Per declared setting the engine also reports, under its own name or the engine-neutral
    one (``DRIFT_CHECKS``): whether they differ."""
    out = {}
    for name in (*DECLARED_KEYS, PREFIX_CACHING):
        runs = value_text(reported.get(name, reported.get(DRIFT_CHECKS.get(name, name))))
        said = value_text(declared.get(name))
        if said is not None and runs is not None:
            out[name] = said != runs
    return out


def config_fingerprint(canonical_json: str) -> str:
    """The sidecar config's fingerprint, from its canonical JSON (``Config.model_dump_json``)."""
    return short_hash(canonical_json)
