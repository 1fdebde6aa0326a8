"""The errors of ferrylink's spill store (``ferrylink.dask.DeviceHostFile``).

Raised by the store's engine (``ferrylink._ferrylink.SpillStore``); a failed operation
leaves every entry that was in memory where it was.
"""

from __future__ import annotations

from .._errors import FerrylinkError

__all__ = ["SpillError", "SpillDiskError", "CorruptSpillFileError", "SpillNoRoomError"]


class SpillError(FerrylinkError):
    """A spill store operation failed (a device copy, or one of the subclasses)."""


class SpillDiskError(SpillError, OSError):
    """Writing, renaming, reading or making a spill file or directory failed: a full
    disk (``errno.ENOSPC``, or ``errno.EFBIG`` past a file size limit), a directory
    the process may not write (``errno.EACCES``)... ``errno`` and ``filename`` say
    which."""


class CorruptSpillFileError(SpillError, ValueError):
    """A spill file does not hold what was written (its checksum, its layout or its
    length disagree). The entry stays on disk; delete the key to drop it."""


class SpillNoRoomError(SpillError, MemoryError):
    """A tier could not make room for an entry (nothing left to evict)."""
