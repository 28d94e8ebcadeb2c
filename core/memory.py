"""Allocator settings for processes that stream MiB-sized messages (artifact uploads).

Each upload chunk is 1 MiB, and Python gRPC, protobuf and file reads allocate a few fresh
1 MiB buffers per chunk and free them again. glibc hands such buffers back to the kernel
(munmap, or trimming the heap top), so every chunk pays for fresh zeroed pages: page faults
that cost several microseconds each in a VM. Keeping them in the heap lets the next chunk
reuse the same pages. Measured on a 2-core VM, 512 MiB through the Upload RPC: 4.4 CPU-s per
GiB and ~260 MiB/s with glibc's defaults, 2.5–3.0 CPU-s per GiB and ~430–500 MiB/s tuned.

Setting either option turns glibc's adaptive mmap threshold off, so both are set: with the
top pad alone every 1 MiB buffer is mmapped and unmapped again (1 MiB file reads: 1,200
instead of 12,000 MiB/s).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TOP_PAD = -2  # glibc malloc.h: extra bytes kept when growing or trimming a heap
M_MMAP_THRESHOLD = -3  # glibc malloc.h: allocations this large or larger are mmapped
TOP_PAD_BYTES = 16 << 20  # a dozen 1 MiB chunks in flight, rounded up
MMAP_THRESHOLD_BYTES = 4 << 20  # the largest message gRPC accepts here: chunks stay in the heap


@functools.cache
def keep_chunk_memory() -> bool:
    """Keep freed MiB buffers for reuse (glibc only); True when the settings took effect.

    Process-wide and idempotent. Buffers of 4 MiB and more still go straight back to the kernel.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs without mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES) == 1 and mallopt(M_TOP_PAD, TOP_PAD_BYTES) == 1
