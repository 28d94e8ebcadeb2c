"""Allocator settings for processes that stream MiB-sized messages (artifact uploads).

Each upload chunk is 1 MiB, and Python gRPC and protobuf allocate a few fresh 1 MiB
buffers per chunk and free them again. glibc hands such buffers back to the kernel
(munmap, or trimming the heap top as soon as more than twice the mmap threshold is
free), so every chunk pays for fresh zeroed pages: page faults that cost several
microseconds each in a VM. Measured on a 2-core VM, 512 MiB through the Upload RPC:
4.4 CPU-s per GiB and ~260 MiB/s with glibc's defaults, 2.5–3.0 CPU-s per GiB and
~430–500 MiB/s with 16 MiB of top pad. Keeping a few MiB of freed memory per malloc arena
lets the next chunk reuse the same pages.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

M_TOP_PAD = -2  # glibc malloc.h: extra bytes kept when growing or trimming a heap
TOP_PAD_BYTES = 16 << 20  # a dozen 1 MiB chunks in flight, rounded up


@functools.cache
def keep_chunk_memory() -> bool:
    """Keep freed MiB buffers for reuse (glibc only); True when the setting took effect.

    Process-wide and idempotent. glibc's adaptive mmap threshold stays on, so buffers
    larger than 32 MiB still go straight back to the kernel.
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs without mallopt
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return mallopt(M_TOP_PAD, TOP_PAD_BYTES) == 1
