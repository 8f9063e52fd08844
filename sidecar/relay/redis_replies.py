"""The rate-limit store's replies, bounded before redis-py reads them (issue 63).

redis-py reads a whole reply before the store can look at it: a server that is not running
the sidecar's script (another service on the store's address, a tampered Redis) answering
with a list of two million numbers held the event loop 12.8 s while it was parsed, then was
refused for its length. ``BoundedReplies`` is redis-py's RESP2 parser that reads each
aggregate's or string's size line first and refuses a size past ``MAX_ITEMS`` or
``MAX_BULK_BYTES`` there, before reading any of it: an ``InvalidResponse``, which the store
turns into a store error (``on_store_error``), and redis-py drops the connection with the
rest unread. The scripts' replies are a handful of integers; the handshake's, a few short
strings.
"""

from __future__ import annotations

from redis._parsers import _AsyncRESP2Parser
from redis.exceptions import InvalidResponse

MAX_ITEMS = 1024  # elements of one array, map, set or push
MAX_BULK_BYTES = 1 << 16  # bytes of one bulk string, error or verbatim string
_COUNTED = frozenset(b"*%~>|")  # the size line counts elements
_SIZED = frozenset(b"$!=")  # the size line counts bytes


class BoundedReplies(_AsyncRESP2Parser):
    """redis-py's parser, refusing a reply larger than the store ever sends before reading
    it (pass as ``parser_class`` with ``protocol=2``)."""

    async def _readline(self) -> bytes:
        line = await super()._readline()
        kind = line[0] if line else 0
        if kind in _COUNTED or kind in _SIZED:
            limit, unit = (MAX_ITEMS, "items") if kind in _COUNTED else (MAX_BULK_BYTES, "bytes")
            try:
                size = int(line[1:])
            except ValueError:
                return line  # the parser's own error
            if size > limit:
                raise InvalidResponse(
                    f"the store's reply holds {size} {unit}, more than {limit}: not the script's"
                )
        return line
