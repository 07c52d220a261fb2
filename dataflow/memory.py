"""Give freed memory back to the operating system.

glibc keeps freed memory in its arenas (one per thread that allocated it), so a process that decoded a
shard or dropped a tokenizer's cache stays as large as it was at its peak; `malloc_trim` returns it.
"""

from __future__ import annotations

import ctypes


def release_freed_memory() -> None:
    """Return the heap's free pages to the OS (a no-op where the C library is not glibc)."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass
