"""Who the client is: a tenant from a hashed API key, or from a header a gateway sets.

The fair-share key (``Tenants.share_key``) is the tenant when the sidecar checked
the client's key itself. A tenant named by a header is only as good as what set it:
a client reaching the sidecar directly can name a new tenant on every request and
take a share for each. So one client address may bring at most
``max_tenants_per_client`` tenants within ``TENANT_WINDOW_S``; its other tenants
share one key, ``client ADDRESS``. The header names one tenant: a repeated one, or one a
gateway appended to (``a, b``), is a 400, never a tenant of its own that no limit names.
"""

from __future__ import annotations

import hashlib
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping

from obs.config import Auth
from obs.sidecar.outcomes import Refusal


class Tenants:
    """Resolves each request's tenant by the config's ``auth`` block."""

    def __init__(
        self,
        auth: Auth,
        max_tenants_per_client: int = 0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.by_hash = {k.sha256: k.tenant for k in auth.api_keys}
        self.header = auth.tenant_header.lower() if auth.tenant_header else None
        self.bound = TenantBound(max_tenants_per_client, clock)

    @property
    def checks_keys(self) -> bool:
        """True when the sidecar itself checks client keys (they stop here, never upstream)."""
        return bool(self.by_hash)

    def resolve(self, headers: Mapping[str, str]) -> str | Refusal | None:
        """The tenant from the client's API key or the header, or the ``Refusal`` (401
        without a listed key, 400 for a header that names more than one)."""
        if self.by_hash:
            scheme, _, key = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                return Refusal(401, "an API key is required: send 'Authorization: Bearer KEY'")
            tenant = self.by_hash.get(hashlib.sha256(key.strip().encode()).hexdigest())
            if tenant is None:
                return Refusal(401, "the API key is not valid for this service")
            return tenant
        if self.header:
            value = headers.get(self.header)
            if value and "," in value:  # repeated, or joined by a gateway that appends
                return Refusal(400, f"the {self.header} header must name one tenant")
            return value[:64] if value else None
        return None

    def key_hash(self, headers: Mapping[str, str]) -> str | None:
        """The SHA-256 of the client's listed API key (its per-key rate limits), or None."""
        if not self.by_hash:
            return None
        key = headers.get("authorization", "").partition(" ")[2].strip()
        digest = hashlib.sha256(key.encode()).hexdigest()
        return digest if digest in self.by_hash else None

    def share_key(self, tenant: str | None, client: str | tuple[str, int] | None) -> str:
        """What fair share counts the request under (see the module docstring); ``client``
        is the client's address (or ASGI's ``scope["client"]``)."""
        if tenant is None or self.checks_keys:
            return tenant or ""
        addr = client if isinstance(client, str) else client[0] if client else ""
        return self.bound.key(tenant, addr)


TENANT_WINDOW_S = 60.0
MAX_CLIENTS = 10_000  # client addresses remembered (the least recent forgotten first)


class TenantBound:
    """At most ``limit`` tenants per client address seen within ``TENANT_WINDOW_S``
    (0: no bound); past it, the address's other tenants share one key."""

    def __init__(self, limit: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.limit = limit
        self.clock = clock
        self._seen: OrderedDict[str, OrderedDict[str, float]] = OrderedDict()

    def key(self, tenant: str, client: str) -> str:
        if self.limit <= 0:
            return tenant
        now = self.clock()
        seen = self._seen.pop(client, None)
        if seen is None:
            seen = OrderedDict()
        self._seen[client] = seen  # the most recent client last
        while len(self._seen) > MAX_CLIENTS:
            self._seen.popitem(last=False)
        while seen and next(iter(seen.values())) < now - TENANT_WINDOW_S:
            seen.popitem(last=False)
        if tenant in seen or len(seen) < self.limit:
            seen[tenant] = now
            seen.move_to_end(tenant)
            return tenant
        return f"client {client}"
