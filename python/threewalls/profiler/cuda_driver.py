"""The profiler's CUDA events through the CUDA driver (libcuda.so.1, which every machine with an
NVIDIA driver has), called through ctypes: create, record, stream wait, query, synchronize, elapsed
time. PyTorch's torch.cuda.Event does the same through its argument parser and a device guard, about
2-4 us of host time a call (a new event's first record creates it, about 4 us more); a recorded step
of an eager loop takes tens of thousands of stamps, each on the host's path wherever the host is not
ahead of the device.

Streams are PyTorch's own (Stream.cuda_stream: CUDA runtime handles are driver handles). Events are
made in the context current on the calling thread, the device's primary context, which PyTorch's
runtime makes current on every thread that uses the device (autograd's device threads included);
working() checks the whole path once (create, record, synchronize, elapsed time) and the profiler
uses PyTorch's events where it fails; a call that fails later is an error (DriverError).
"""
from __future__ import annotations

import ctypes
from typing import Optional

_CU_EVENT_DISABLE_TIMING = 0x2
_CUDA_ERROR_NOT_READY = 600


class DriverError(RuntimeError):
    pass


class Event:
    """A CUDA event made through the driver, with the methods of torch.cuda.Event that the profiler
    uses (query, synchronize, elapsed_time in milliseconds)."""
    __slots__ = ("drv", "h", "__weakref__")

    def __init__(self, drv: "Driver", timing: bool = True):
        self.drv = drv
        self.h = drv.create(timing)

    def query(self) -> bool:
        rc = self.drv._query(self.h)
        if rc == 0:
            return True
        if rc == _CUDA_ERROR_NOT_READY:
            return False
        raise DriverError(f"cuEventQuery: CUDA error {rc}")

    def synchronize(self) -> None:
        rc = self.drv._sync(self.h)
        if rc != 0:
            raise DriverError(f"cuEventSynchronize: CUDA error {rc}")

    def elapsed_time(self, end: "Event") -> float:
        ms = ctypes.c_float()
        rc = self.drv._elapsed(ctypes.byref(ms), self.h, end.h)
        if rc != 0:
            raise DriverError(f"cuEventElapsedTime: CUDA error {rc}")
        return ms.value

    def __del__(self):
        try:
            self.drv._destroy(self.h)
        except Exception:  # interpreter shutdown: the library may be gone
            pass


class Driver:
    def __init__(self, lib: ctypes.CDLL):
        vp, ui, i = ctypes.c_void_p, ctypes.c_uint, ctypes.c_int

        def fn(name, *args):
            f = getattr(lib, name)
            f.argtypes = args
            f.restype = i
            return f

        self._create = fn("cuEventCreate", ctypes.POINTER(vp), ui)
        self._destroy = fn("cuEventDestroy_v2", vp)
        self._record = fn("cuEventRecord", vp, vp)
        self._wait = fn("cuStreamWaitEvent", vp, vp, ui)
        self._query = fn("cuEventQuery", vp)
        self._sync = fn("cuEventSynchronize", vp)
        self._elapsed = fn("cuEventElapsedTime", ctypes.POINTER(ctypes.c_float), vp, vp)

    def create(self, timing: bool) -> int:
        h = ctypes.c_void_p()
        rc = self._create(ctypes.byref(h), 0 if timing else _CU_EVENT_DISABLE_TIMING)
        if rc != 0 or not h.value:
            raise DriverError(f"cuEventCreate: CUDA error {rc}")
        return h.value

    def event(self, timing: bool = True) -> Event:
        return Event(self, timing)

    def record(self, event: int, stream: int) -> bool:
        return self._record(event, stream) == 0

    def stamp(self, marker: int, stream: int, timer: int, event: int) -> bool:
        """Marker on `stream`, `timer` waits for it, `event` on `timer`; False if a call failed."""
        return (self._record(marker, stream) == 0 and self._wait(timer, marker, 0) == 0
                and self._record(event, timer) == 0)


def load() -> Optional[Driver]:
    """The driver's calls, or None where there is no NVIDIA driver library."""
    try:
        return Driver(ctypes.CDLL("libcuda.so.1"))
    except (OSError, AttributeError):
        return None


def working(stream: int) -> Optional[Driver]:
    """The driver's calls if they work here: two events recorded on `stream` (a PyTorch stream's
    cuda_stream, in the current context), waited for and timed; else None."""
    drv = load()
    if drv is None:
        return None
    try:
        a, b = drv.event(), drv.event()
        if not (drv.record(a.h, stream) and drv.record(b.h, stream)):
            return None
        b.synchronize()
        if a.elapsed_time(b) < 0.0 or not a.query():
            return None
    except DriverError:
        return None
    return drv
