"""What a store call raises: ``StoreError`` and its two kinds callers tell apart.

``StoreUnavailable``: the database is down, unreachable, too slow (a call's bound ran out) or refused
our credentials; retrying later may work, and device turns go on without what the store holds.
``StoreConflict``: a write broke a unique or foreign key constraint (a name taken, a row gone).
Anything else (a ``StoreError`` itself): the schema or data is wrong for this gateway, e.g. a schema
newer than this gateway knows, or a value the database rejects. No message carries the URL's password.
"""

from __future__ import annotations

__all__ = ["StoreConflict", "StoreError", "StoreUnavailable"]


class StoreError(Exception):
    """The store could not do what was asked."""


class StoreUnavailable(StoreError):
    """The database did not answer (down, unreachable, too slow) or refused the connection."""


class StoreConflict(StoreError):
    """A write broke a constraint (unique key, foreign key, not null)."""
