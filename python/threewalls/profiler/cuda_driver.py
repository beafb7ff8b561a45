"""The profiler's stamp as three CUDA driver calls through ctypes (libcuda.so.1, which every machine
with an NVIDIA driver has): record the marker on the timed stream, make the timer stream wait for it,
record the timing event on the timer stream. PyTorch's Event.record and Stream.wait_event do the
same through its argument parser and a device guard each, about 2 us of host time a call; a stamp
is on the host's path wherever the host is not ahead of the device.

The handles are PyTorch's own (Event.cuda_event, Stream.cuda_stream): CUDA runtime handles are
driver handles, and PyTorch's streams and events live in the device's primary context, which the
runtime makes current on every thread that uses the device (autograd's device threads included).
"""
from __future__ import annotations

import ctypes
from typing import Optional


class DriverStamps:
    __slots__ = ("_record", "_wait")

    def __init__(self, lib: ctypes.CDLL):
        self._record = lib.cuEventRecord
        self._record.argtypes = (ctypes.c_void_p, ctypes.c_void_p)
        self._record.restype = ctypes.c_int
        self._wait = lib.cuStreamWaitEvent
        self._wait.argtypes = (ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint)
        self._wait.restype = ctypes.c_int

    def stamp(self, marker: int, stream: int, timer: int, event: int) -> bool:
        """Marker on `stream`, `timer` waits for it, `event` on `timer`; False if a call failed (the
        caller then stamps through PyTorch)."""
        return (self._record(marker, stream) == 0 and self._wait(timer, marker, 0) == 0
                and self._record(event, timer) == 0)


def load() -> Optional[DriverStamps]:
    """The driver's calls, or None where there is no NVIDIA driver library."""
    try:
        return DriverStamps(ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError):
        return None
