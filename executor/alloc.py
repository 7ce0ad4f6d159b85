"""Keep freed host memory in the process, as a caching allocator does.

glibc hands large freed blocks back to the OS (a block from mmap on free, the heap's
top once past the trim threshold), so the next allocation of that size faults its
pages back in, zeroed. Whether an op pays that depends on the heap's layout at that
moment, which no profile can know: on the 2-core VM the LM head's F (its logits are
1 MB) took 1.6 ms with freed memory kept and 2.0-2.9 ms without, from one process to
the next, and that alone put the demo's predicted speed-up 3-6 points high (the head
sits on the last rank of every split). CUDA's caching allocator never returns memory
mid-run and CPU training setups preload jemalloc or tcmalloc for the same reason; the
executor's ranks and every profiling process keep freed memory the same way, so both
time the op and not the heap.
"""

from __future__ import annotations

import ctypes
import sys

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
"""glibc's ceiling for M_MMAP_THRESHOLD on 64-bit; larger blocks are still mmap'd."""


def keep_freed_memory() -> bool:
    """Ask glibc's malloc never to trim the heap and to mmap only blocks over 32 MiB.
    True when it took; False where the C library has no such switch (nothing changes)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, 2**31 - 1)) and \
        bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX))
