"""Freed memory kept by the process (glibc's allocator).

A training step allocates and frees the same activations and gradients every step. With glibc's
defaults the freed top of the heap goes back to the kernel (trimmed) and the next step faults it in
again, page by page, each page zeroed. Kept, a training process faults 0.13-0.64x as often; on the
Xeon with AMX the default Transformer trained at 1.04-1.06x the tokens/s, the RNN at 1.03-1.06x and
the LSTM (float32, few page faults either way) at 0.98x, within the machine's drift; the losses are
the same to the last bit (benchmarks/keep_freed_memory.py). The cost: a process holds on to the
most heap it has used; blocks of MMAP_THRESHOLD and larger do not count against it (they are mapped
on their own and returned when freed).

Set once per process (`keep_freed_memory`), where a training starts and in every worker; a forked
child inherits it. PIPELINE_KEEP_FREED_MEMORY=0 leaves glibc's defaults.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

ENV = "PIPELINE_KEEP_FREED_MEMORY"
M_TRIM_THRESHOLD = -1  # mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
TRIM_THRESHOLD = 2**31 - 1  # free heap top kept up to this (mallopt takes an int: its largest)
MMAP_THRESHOLD = 32 * 2**20  # blocks this large and larger are mapped on their own (glibc's ceiling on 64-bit)


def keep_freed_memory() -> bool:
    """Keep freed memory in this process's heap (see the module's text): True when set, False where
    the C library is not glibc or PIPELINE_KEEP_FREED_MEMORY=0 (nothing changed)."""
    if os.environ.get(ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # no glibc (musl has no mallopt)
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
