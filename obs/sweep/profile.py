"""A routing profile: a lanes/pools config plus each pool's ``vllm serve`` scheduler flags.

Spec (YAML) -> :class:`Profile` (this module, no I/O besides reading the file).
A profile file is a lanes config (``docs/lanes.md``) with three additions: a
``name``, an ``engine:`` block per pool (the scheduler flags and how many local
replicas to start), and optionally ``base_lanes: default``, which takes the
shipped six lanes and lets ``lanes:`` override fields of them by lane name.
Pool ``replicas`` are optional: the sweep fills them with the pools it starts
(or, with ``--external``, uses the URLs given). A ``gpu:`` block's ``calibration``
(a host calibration file, ``engine sim check --fit``) is read here, once, relative to
the profile's folder. Every error names the file and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from obs.config import (
    Config,
    default_config_path,
    parse_config,
    read_yaml,
    validation_error,
)
from obs.config_blocks import NAME_RE, DeclaredEngine
from obs.engines.sim.calibration import HostCalibration, load_calibration
from obs.engines.sim.hardware import PerfModel, perf_model, with_calibration
from obs.errors import ConfigError

PositiveInt = Annotated[int, Field(gt=0)]
# Stands in for the replica URL of a pool the sweep starts itself.
PLACEHOLDER_URL = "http://127.0.0.1:1"
SHIPPED_PREFIX = "profile-"
# The shipped profiles, in the order the sweep runs them (the first is the baseline).
SHIPPED = (
    "single-balanced",
    "single-large-budget",
    "small-interactive",
    "prefix-routing",
    "slow-client-isolation",
    "class-aware",
)
# EngineFlags field -> the `vllm serve` flag it sets.
FLAGS = {
    "max_num_batched_tokens": "--max-num-batched-tokens",
    "max_num_seqs": "--max-num-seqs",
    "max_num_partial_prefills": "--max-num-partial-prefills",
    "max_long_partial_prefills": "--max-long-partial-prefills",
    "long_prefill_token_threshold": "--long-prefill-token-threshold",
    "stream_interval": "--stream-interval",
}


def _calibration(value: object, info: ValidationInfo) -> HostCalibration | None:
    """A ``gpu:`` block's ``calibration``: the host calibration file it names, read once;
    a relative path is taken from the profile's folder (the validation context's ``base``)."""
    if value is None or isinstance(value, HostCalibration):
        return value
    if not isinstance(value, str | Path) or not str(value).strip():
        raise ValueError("give the path of a host calibration file (engine sim check --fit)")
    path = Path(value).expanduser()
    base = (info.context or {}).get("base")
    if not path.is_absolute() and base is not None:
        path = Path(base) / path
    path = path.resolve()
    try:
        return load_calibration(path)
    except ConfigError as e:  # its words name engine sim's flag; here the field is named
        raise ValueError(f"{path}: {str(e).removeprefix(f'--calibration {path}: ')}") from e


# The loaded file; it dumps as its (resolved) path.
CalibrationFile = Annotated[
    HostCalibration | None,
    PlainValidator(_calibration),
    PlainSerializer(lambda c: None if c is None else c.path, return_type=str | None),
]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class GpuFlags(_Model):
    """One pool at GPU scale (``vllm-obs sweep --engine sim``): replicas and vLLM flags as
    on GPUs, each replica a simulated vLLM on the named GPU and model (docs/sim.md)."""

    replicas: PositiveInt = 1
    gpu: str = "H100"
    model: str = "llama-3.1-8b"
    max_num_batched_tokens: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    long_prefill_token_threshold: PositiveInt | None = None
    stream_interval: PositiveInt | None = None
    prefix_caching: bool = True
    kv_blocks: PositiveInt | None = None  # --num-gpu-blocks-override (default: what fits)
    calibration: CalibrationFile = None  # --calibration: this host's corrections (docs/sim.md)

    def perf(self) -> PerfModel:
        """The replica's performance model: the GPU and model, with the calibration's
        corrections when the block names one (as ``engine sim --calibration`` applies them)."""
        perf = perf_model(self.gpu, self.model)
        return perf if self.calibration is None else with_calibration(perf, self.calibration.cal)

    def sim_args(self) -> list[str]:
        """The ``vllm-obs engine sim`` arguments these flags stand for."""
        args = ["--gpu", self.gpu, "--model", self.model]
        if self.calibration is not None:
            args += ["--calibration", self.calibration.path]
        for field in ("max_num_batched_tokens", "max_num_seqs", "long_prefill_token_threshold"):
            value = getattr(self, field)
            if value is not None:
                args += [FLAGS[field], str(value)]
        if self.stream_interval is not None:
            args += ["--stream-interval", str(self.stream_interval)]
        if self.kv_blocks is not None:
            args += ["--num-gpu-blocks-override", str(self.kv_blocks)]
        if not self.prefix_caching:
            args.append("--no-enable-prefix-caching")
        return args

    def describe(self) -> str:
        reps = f"{self.replicas} x " if self.replicas > 1 else ""
        return f"{reps}sim {' '.join(self.sim_args())}"


class EngineFlags(_Model):
    """One pool's engine: its ``vllm serve`` scheduler flags (unset: vLLM's default).

    The same block as a lanes config pool's ``engine: {kind: vllm, max_num_seqs: 64}``,
    plus what the sweep needs to start it (replicas, KV size, other arguments)."""

    kind: Literal["vllm"] = "vllm"  # the sweep starts vLLM pools
    replicas: PositiveInt = 1  # local replicas the sweep starts (ignored with --external)
    max_num_batched_tokens: PositiveInt | None = None
    max_num_seqs: PositiveInt | None = None
    max_num_partial_prefills: PositiveInt | None = None
    max_long_partial_prefills: PositiveInt | None = None
    long_prefill_token_threshold: PositiveInt | None = None
    stream_interval: PositiveInt | None = None
    prefix_caching: bool = True
    kv_cache_mib: PositiveInt | None = None  # local pools: --kv-cache-memory-bytes
    extra_args: list[str] = Field(default_factory=list)
    gpu: GpuFlags | None = None  # the pool at GPU scale, for --engine sim

    @model_validator(mode="after")
    def _possible(self) -> EngineFlags:
        long, partial = self.max_long_partial_prefills, self.max_num_partial_prefills
        if long is not None and long > (partial or 1):
            raise ValueError(
                f"max_long_partial_prefills ({long}) must not exceed max_num_partial_prefills "
                f"({partial or '1, the vLLM default'})"
            )
        budget, seqs = self.max_num_batched_tokens, self.max_num_seqs
        if budget is not None and seqs is not None and budget < seqs:
            raise ValueError(
                f"max_num_batched_tokens ({budget}) must be at least max_num_seqs ({seqs}): "
                "vLLM refuses a step budget smaller than its batch"
            )
        return self

    def vllm_args(self) -> list[str]:
        """The ``vllm serve`` arguments these flags stand for."""
        args: list[str] = []
        for field, flag in FLAGS.items():
            value = getattr(self, field)
            if value is not None:
                args += [flag, str(value)]
        if not self.prefix_caching:
            args.append("--no-enable-prefix-caching")
        return args + list(self.extra_args)

    def declared(self) -> dict[str, Any]:
        """The lanes config's engine block for a pool started with these flags: the sweep
        declares what it passes, so its sidecar's settings series and fingerprints carry it."""
        names = DeclaredEngine.model_fields
        values = self.model_dump(include=set(names), exclude_none=True)
        return {"kind": self.kind, **values}

    def describe(self) -> str:
        kv = f" kv {self.kv_cache_mib} MiB" if self.kv_cache_mib else ""
        reps = f"{self.replicas} x " if self.replicas > 1 else ""
        return f"{reps}{' '.join(self.vllm_args()) or '(vLLM defaults)'}{kv}"


class ProfilePool(BaseModel):
    """A pool of the profile: any lanes-config pool field, plus ``engine``."""

    model_config = ConfigDict(extra="allow", frozen=True)

    name: Annotated[str, Field(pattern=NAME_RE)]
    engine: EngineFlags = EngineFlags()
    replicas: list[str] | None = None

    @field_validator("engine", mode="before")
    @classmethod
    def _kind_only(cls, engine: Any) -> Any:
        return {"kind": engine} if isinstance(engine, str) else engine  # engine: vllm


class ProfileSpec(_Model):
    version: Literal[1] = 1
    name: Annotated[str, Field(pattern=NAME_RE)]
    description: str = ""
    base_lanes: Literal["default"] | None = None
    pools: list[ProfilePool] = Field(min_length=1)
    lanes: list[dict[str, Any]] | dict[str, dict[str, Any]]
    default_lane: str | None = None
    auth: dict[str, Any] | None = None
    # How the stress replay (obs.sweep.replay) admits: "capacity" sizes each lane's limit
    # from its pools' capacity (obs.sweep.capacity), "shared" gives each pool one gate for
    # all its lanes (the lab's global pool), "lanes" keeps the lanes' own blocks.
    admission: Literal["capacity", "shared", "lanes"] = "capacity"


@dataclass(frozen=True, slots=True)
class Profile:
    """A validated profile: its lanes config (replicas still placeholders) and engines."""

    name: str
    description: str
    source: str
    config: Config
    engines: dict[str, EngineFlags]
    external: dict[str, list[str]]  # pool -> replica URLs given in the file
    admission: str = "capacity"  # the stress replay's admission (ProfileSpec.admission)

    def lanes_config(
        self, replicas: dict[str, list[str]], engine: str | None = None
    ) -> dict[str, Any]:
        """The lanes config (as YAML-ready data) with each pool's replicas filled in (and
        each pool's ``engine:`` set, when given)."""
        data = self.config.model_dump(mode="json", by_alias=True, exclude_defaults=True)
        for pool in data["pools"]:
            pool["replicas"] = list(replicas[pool["name"]])
            if engine is not None:
                pool["engine"] = engine
        return data

    def gpu_pools(self) -> dict[str, GpuFlags]:
        """Each pool at GPU scale: its ``gpu:`` block, or one H100 replica with vLLM's
        defaults when the profile gives none; the pool's ``prefix_caching`` and
        ``stream_interval`` hold at GPU scale too unless the ``gpu:`` block sets its own."""
        out = {}
        for name, flags in self.engines.items():
            gpu = flags.gpu or GpuFlags()
            inherit: dict[str, Any] = {}
            if "prefix_caching" not in gpu.model_fields_set:
                inherit["prefix_caching"] = flags.prefix_caching
            if gpu.stream_interval is None and flags.stream_interval is not None:
                inherit["stream_interval"] = flags.stream_interval
            out[name] = gpu.model_copy(update=inherit) if inherit else gpu
        return out

    def gates(self) -> dict[str, tuple[Any, Any]]:
        """Per lane, its TTFT and TPOT SLOs: the gates of gated goodput."""
        return {lane.name: (lane.slo.ttft, lane.slo.tpot) for lane in self.config.lanes}


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _lanes(spec: ProfileSpec, source: str) -> tuple[list[Any], str | None]:
    if spec.base_lanes is None:
        if not isinstance(spec.lanes, list):
            raise ConfigError(
                f"{source}: lanes: give a list of lanes, or base_lanes: default and a mapping "
                "of lane name to the fields to change"
            )
        return list(spec.lanes), spec.default_lane
    base = yaml.safe_load(default_config_path().read_text(encoding="utf-8"))
    if not isinstance(spec.lanes, dict):
        raise ConfigError(
            f"{source}: lanes: with base_lanes, give a mapping of lane name to fields to change"
        )
    names = [lane["name"] for lane in base["lanes"]]
    for name in spec.lanes:
        if name not in names:
            raise ConfigError(
                f"{source}: lanes.{name}: no such lane in the default lanes ({', '.join(names)})"
            )
    lanes = [_merge(lane, spec.lanes.get(lane["name"], {})) for lane in base["lanes"]]
    return lanes, spec.default_lane or base["default_lane"]


def parse_profile(data: object, source: str = "<profile>", base: Path | None = None) -> Profile:
    """Validate loaded YAML; errors name ``source`` and each field. Relative file paths in
    it (a ``gpu:`` block's ``calibration``) are taken from ``base``, by default the folder
    of ``source`` when that is a file, else the current directory."""
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: a profile is a YAML mapping (name, pools, lanes)")
    if base is None and Path(source).is_file():
        base = Path(source).parent
    try:
        spec = ProfileSpec.model_validate(data, context={"base": base})
    except ValidationError as e:
        raise validation_error(source, "profile", e) from e
    lanes, default_lane = _lanes(spec, source)
    pools = []
    for pool in spec.pools:
        fields = pool.model_dump(exclude={"engine", "replicas"}, exclude_unset=True)
        pools.append(
            {
                **fields,
                "engine": pool.engine.declared(),
                "replicas": pool.replicas or [PLACEHOLDER_URL],
            }
        )
    config_data: dict[str, Any] = {"pools": pools, "lanes": lanes, "default_lane": default_lane}
    if spec.auth is not None:
        config_data["auth"] = spec.auth
    config = parse_config(config_data, source)
    return Profile(
        name=spec.name,
        description=spec.description,
        source=source,
        config=config,
        engines={p.name: p.engine for p in spec.pools},
        external={p.name: list(p.replicas) for p in spec.pools if p.replicas},
        admission=spec.admission,
    )


def is_profile(data: object) -> bool:
    """Whether loaded YAML looks like a profile rather than a plain lanes config."""
    return isinstance(data, dict) and ("name" in data or "base_lanes" in data)


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile file."""
    return parse_profile(read_yaml(path, "profile"), str(path), Path(path).parent)


def shipped_path(name: str) -> Path:
    return default_config_path().parent / f"{SHIPPED_PREFIX}{name}.yaml"


def resolve(name_or_file: str) -> Profile:
    """A shipped profile by name, or a profile file by path."""
    if name_or_file in SHIPPED:
        return load_profile(shipped_path(name_or_file))
    path = Path(name_or_file)
    if path.exists() or path.suffix in (".yaml", ".yml"):
        return load_profile(path)
    raise ConfigError(
        f"--profile {name_or_file!r}: not a shipped profile ({', '.join(SHIPPED)}) and no such file"
    )


def check_same_gates(profiles: list[Profile]) -> None:
    """Refuse profiles that gate the same lane differently: their goodput would not compare."""
    seen: dict[str, tuple[str, tuple[Any, Any]]] = {}
    for profile in profiles:
        for lane, gate in profile.gates().items():
            first = seen.setdefault(lane, (profile.name, gate))
            if first[1] != gate:
                raise ConfigError(
                    f"profiles {first[0]!r} and {profile.name!r} give lane {lane!r} different "
                    "TTFT/TPOT SLOs; the matrix compares profiles on one gate per lane"
                )
    names = [p.name for p in profiles]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"profile named twice: {', '.join(dupes)}")
