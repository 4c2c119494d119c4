"""A DataLoader worker's heap kept warm: freed sample buffers reused, not handed back each time.

Every sample a worker reads is a new ``bytes`` object (the ``pread`` of its span,
then one per member), freed once the batch is collated. With glibc's defaults
the heap top is trimmed back to the kernel whenever more than 128 KiB is free
there, and an allocation past the (dynamic) mmap threshold is an ``mmap`` of its
own: so nearly every sample's buffers are pages the kernel must find, zero and
fault in again. Measured on a 2-CPU VM (read a sample's span with ``pread``,
copy out its member, a batch of 32 held, then freed): 7.7 / 74 / 872 µs per
sample at 10 KB / 100 KB / 1 MB with the defaults, 3.2 / 12.8 / 183 µs with the
settings below (docs/benchmarks-data.md).

:func:`keep_heap_warm` sets, once per process, ``M_TRIM_THRESHOLD`` to
:data:`TRIM_THRESHOLD` (so up to that much free memory stays at the heap top
for the next samples) and ``M_MMAP_THRESHOLD`` to :data:`MMAP_THRESHOLD` (so a
sample of up to that size comes from the heap). It is called in DataLoader
worker processes only -- processes that exist to run the dataset -- never in the
training process, and not at all where the user chose malloc settings of their
own (any ``MALLOC_*_`` variable or ``GLIBC_TUNABLES`` in the environment), where
the C library is not glibc, or where ``MOUTHGUARD_WORKER_HEAP=default`` says so
(``warm``, or unset, is the default; any other value is a ConfigError naming the
variable).
The cost is memory: each worker may hold up to :data:`TRIM_THRESHOLD` of free heap
it would otherwise have returned.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform

from mouthguard.errors import ConfigError

#: glibc's ``mallopt`` parameters (malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3

#: Free bytes kept at the top of a worker's heap before any is returned to the kernel.
TRIM_THRESHOLD = 64 * 1024 * 1024
#: Allocations below this come from the heap (glibc's ceiling for the setting on 64-bit).
MMAP_THRESHOLD = 32 * 1024 * 1024
#: ``MOUTHGUARD_WORKER_HEAP=default`` leaves the worker's malloc settings as they are;
#: ``warm`` (or unset) applies them.
OPT_OUT_ENV = "MOUTHGUARD_WORKER_HEAP"
_CHOICES = ("warm", "default")

#: The process that applied the settings (a forked child must apply them itself).
_done_in: int | None = None
#: The process that found them not to apply, so its later iterations look no further
#: (``platform.libc_ver`` reads the interpreter's executable).
_declined_in: int | None = None


def _user_chose_malloc() -> bool:
    env = os.environ
    choice = env.get(OPT_OUT_ENV, "warm").strip().lower()
    if choice not in _CHOICES:
        raise ConfigError(f"{OPT_OUT_ENV} must be 'warm' or 'default', not {choice!r}")
    if choice == "default":
        return True
    if "glibc.malloc" in env.get("GLIBC_TUNABLES", ""):
        return True
    return any(name.startswith("MALLOC_") and name.endswith("_") for name in env)


def keep_heap_warm() -> bool:
    """Apply the worker heap settings in this process, once; whether they are in force.

    False (nothing changed) off Linux/glibc, where the user set malloc options of
    their own, or where ``mallopt`` refused a value.

    Raises:
        ConfigError: ``MOUTHGUARD_WORKER_HEAP`` is neither ``warm`` nor ``default``.
    """
    global _done_in, _declined_in  # noqa: PLW0603 - once per process, forked children included
    pid = os.getpid()
    if _done_in == pid:
        return True
    if _declined_in == pid:
        return False
    if _apply():
        _done_in = pid
        return True
    _declined_in = pid
    return False


def _apply() -> bool:
    """Set both thresholds; False where they do not apply or glibc refused one."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc" or _user_chose_malloc():
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    mallopt = ctypes.CDLL(name).mallopt
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # mallopt returns 1 on success; setting either turns off glibc's dynamic thresholds.
    # Both values are within glibc's limits, so a refusal means another allocator.
    mapped: int = mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
    trimmed: int = mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD) if mapped == 1 else 0
    return mapped == 1 and trimmed == 1
