"""Batch commands keep freed memory instead of handing it back to the kernel.

glibc gives every large block (numpy arrays above 32 MB) back to the kernel
when it is freed, so each pass over a 77 M-row recording faults its pages in
again and the kernel zeroes them: on a 32,768-endpoint `netskel infer` that
was 25 of its 37 CPU-seconds spent in the kernel. A batch command reaches
its peak anyway, so it keeps freed blocks in one heap (one arena, so threads
reuse them too) and the next pass reuses them. Long-running servers do not
call this: there, returning memory matters more."""

from __future__ import annotations

import ctypes

M_TRIM_THRESHOLD = -1
M_MMAP_MAX = -4
M_ARENA_MAX = -8
_KEEP = 2**31 - 1  # mallopt's largest: keep up to 2 GB of free heap top


def retain_freed_memory() -> bool:
    """True when the C library took the settings (glibc); elsewhere a no-op."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return all(mallopt(k, v) == 1 for k, v in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0),
                                                (M_TRIM_THRESHOLD, _KEEP)))
