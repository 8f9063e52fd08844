"""The project's exception hierarchy.

HTTP statuses and bodies for the sidecar's own errors are mapped in one place,
``obs.sidecar.outcomes`` (the relay and the app's own routes both answer through it);
everything here is I/O-free.
"""

from __future__ import annotations


class ObsError(Exception):
    """Base of every error the project raises on purpose."""


class ConfigError(ObsError):
    """Bad configuration or settings: the message names the file/flag and the field."""


class InputError(ObsError):
    """Bad input data (an event log, a query argument) that the user can fix."""
