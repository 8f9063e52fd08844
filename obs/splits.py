"""Weighted splits: which arm of a lane's split a client identity goes to.

Pure. An identity (an API key's hash, a tenant, an address) hashes to a point in
[0, 1), keyed with a secret salt (the sidecar's ``--split-salt-file``, or
``VLLM_OBS_SPLIT_SALT``): without the salt nobody can compute offline which keys land in
the canary and choose their arm. The arms, in config order, share that interval by
weight and the point picks one. The same identity always lands on the same arm (its
conversation keeps one arm and that arm's prefix cache), across restarts and sidecar
workers (while the salt is kept), and over many
identities each arm gets about its weight's share. Raising the last arm's weight
(a canary's 5 -> 10) only moves identities from the other arms onto it.
"""

from __future__ import annotations

from collections.abc import Sequence
from hashlib import blake2b
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from obs.durations import seconds

_SPAN = 1 << 64
SALT_ENV = "VLLM_OBS_SPLIT_SALT"  # the salt itself, shared by every sidecar of a fleet
MAX_SALT = 64  # bytes of the salt that key the hash (blake2b's key size)


def point(identity: str, salt: bytes = b"") -> float:
    """The identity's stable point in [0, 1), keyed by ``salt``."""
    digest = blake2b(
        identity.encode("utf-8", "surrogatepass"), digest_size=8, key=salt[:MAX_SALT]
    ).digest()
    return int.from_bytes(digest, "big") / _SPAN


def identity_hash(identity: str, salt: bytes) -> str:
    """A short keyed hash of an identity, for the event (``identity``): stable while the salt
    is, and not the identity (an API key's hash never reaches a log)."""
    key = salt[:MAX_SALT]
    data = identity.encode("utf-8", "surrogatepass")
    return blake2b(data, digest_size=8, key=key, person=b"vllm-obs-id").hexdigest()


def choose(arms: Sequence[tuple[str, int]], identity: str, salt: bytes = b"") -> str:
    """The arm (pool name) of ``arms`` ((pool, positive weight), in order) for ``identity``."""
    if not arms:
        raise ValueError("a split needs at least one arm")
    total = sum(w for _, w in arms)
    if total <= 0 or any(w <= 0 for _, w in arms):
        raise ValueError("split weights must be positive")
    at = point(identity, salt) * total
    upto = 0
    for pool, weight in arms:
        upto += weight
        if at < upto:
            return pool
    return arms[-1][0]  # float rounding at the very top of the interval


class Canary(BaseModel):
    """A split lane's arms: what keeps a client on one arm, and the margins of the verdict.

    The baseline is the arm with the largest weight (the first listed on a tie); every other
    arm is a canary judged against it (``vllm-obs query canary``, the canary alert).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    # Which client identity picks the arm: the API key (its hash), the tenant, or the client's
    # address; a request without that identity uses its address.
    sticky: Literal["api_key", "tenant", "address"] = "api_key"
    # Roll back when the canary's p95 is this much worse than the baseline's (0.15 = 15%).
    ttft_p95_margin: Annotated[float, Field(gt=0)] = 0.15
    tpot_p95_margin: Annotated[float, Field(gt=0)] = 0.15
    # Fewer requests than this on an arm in the window: hold (not enough to judge).
    min_requests: Annotated[int, Field(gt=0)] = 100
    # In the verdict, one client identity (the event's ``identity``) counts for at most this
    # many times the arm's median requests per identity: a few keys sending many (slow)
    # requests cannot carry it. null: every request counts.
    max_identity_weight: Annotated[float, Field(ge=1)] | None = 1.0
    # The alert's window (the verdict's default window is the whole log).
    window: str = "1h"

    @field_validator("window")
    @classmethod
    def _duration(cls, v: str) -> str:
        seconds(v)
        return v


def with_baseline(data: object) -> object:
    """A lane's raw config with ``pool`` filled in as its split's baseline (heaviest) arm."""
    if not isinstance(data, dict) or data.get("split") is None:
        return data
    if data.get("pool") is not None:
        raise ValueError("give either pool or split, not both")
    split = data["split"]
    if not isinstance(split, dict) or len(split) < 2:
        raise ValueError("split: name at least two pools with their weights")
    weights = {k: v for k, v in split.items() if isinstance(v, int)}
    baseline = max(weights, key=lambda k: weights[k]) if weights else next(iter(split))
    return {**data, "pool": baseline}
