"""Who the client is: a tenant from a hashed API key, or from a header a gateway sets."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from obs.config import Auth
from obs.sidecar import errors as e


class Tenants:
    """Resolves each request's tenant by the config's ``auth`` block."""

    def __init__(self, auth: Auth) -> None:
        self.by_hash = {k.sha256: k.tenant for k in auth.api_keys}
        self.header = auth.tenant_header.lower() if auth.tenant_header else None

    @property
    def checks_keys(self) -> bool:
        """True when the sidecar itself checks client keys (they stop here, never upstream)."""
        return bool(self.by_hash)

    def resolve(self, headers: Mapping[str, str]) -> str | None:
        """The tenant from the client's API key (401 without a listed key) or the header."""
        if self.by_hash:
            scheme, _, key = headers.get("authorization", "").partition(" ")
            if scheme.lower() != "bearer" or not key.strip():
                raise e.Unauthorized("an API key is required: send 'Authorization: Bearer KEY'")
            tenant = self.by_hash.get(hashlib.sha256(key.strip().encode()).hexdigest())
            if tenant is None:
                raise e.Unauthorized("the API key is not valid for this service")
            return tenant
        if self.header:
            value = headers.get(self.header)
            return value[:64] if value else None
        return None
