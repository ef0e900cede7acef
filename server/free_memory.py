"""Handing freed heap pages back to the OS once a lot of per-agent state was dropped."""

from __future__ import annotations

#: Freeing at least this many per-agent entries at once also hands free heap pages back to the OS.
TRIM_AFTER_ENTRIES = 10_000


def release_free_memory() -> None:
    """Return freed heap pages to the OS (glibc's malloc_trim); a no-op elsewhere.
    Without it, the RSS of a client's freed per-agent state stays with the process."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
