"""pytest plugin: find what invalidates a CUDA-graph capture (``-p capture_probe``, profiling/ on PYTHONPATH).

While a ``torch.cuda.graph`` capture is open it traces Python lines of the project (python/, rl/) and, after
each, asks the driver for the capturing stream's status. The first line after which the status is no longer
ACTIVE is logged with its stack, as are garbage collections and the live threads during the capture.
Log: $CAPTURE_PROBE_LOG (default capture_probe.log). CAPTURE_PROBE_GC_OFF=1 disables the cyclic GC
during captures (an A/B of the GC hypothesis).
"""
from __future__ import annotations

import gc
import os
import sys
import threading
import traceback

import torch
from cuda.bindings import driver as cu

LOG = os.environ.get("CAPTURE_PROBE_LOG", "capture_probe.log")
GC_OFF = os.environ.get("CAPTURE_PROBE_GC_OFF") == "1"
ROOTS = tuple(os.path.abspath(p) for p in ("python", "rl"))


def _write(text: str) -> None:
    with open(LOG, "a") as f:
        f.write(text + "\n")


def _status(stream_ptr: int) -> int:
    err, status = cu.cuStreamIsCapturing(cu.CUstream(stream_ptr))
    return int(status) if err == cu.CUresult.CUDA_SUCCESS else -int(err)


class _Probe:
    def __init__(self, stream_ptr: int, test: str):
        self.stream_ptr, self.test, self.last, self.reported = stream_ptr, test, "(capture begin)", False

    def tracer(self, frame, event, arg):
        if not frame.f_code.co_filename.startswith(ROOTS):
            return None
        if event == "line" and not self.reported:
            status = _status(self.stream_ptr)
            if status != int(cu.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_ACTIVE):
                self.reported = True
                _write(f"[{self.test}] capture status {status} first seen at "
                       f"{frame.f_code.co_filename}:{frame.f_lineno}; previous traced line {self.last}\n"
                       + "".join(traceback.format_stack(frame, limit=12)))
            self.last = f"{frame.f_code.co_filename}:{frame.f_lineno}"
        return self.tracer


_current_test = ["?"]
_original_enter, _original_exit = torch.cuda.graph.__enter__, torch.cuda.graph.__exit__


def _on_gc(phase, info):
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        _write(f"[{_current_test[0]}] gc {phase} during capture: {info}")


def _enter(self):
    result = _original_enter(self)
    stream_ptr = torch.cuda.current_stream().cuda_stream
    threads = [t.name for t in threading.enumerate()]
    _write(f"[{_current_test[0]}] capture begins: threads {threads}, gc counts {gc.get_count()}, gc off {GC_OFF}")
    if GC_OFF:
        gc.disable()
    probe = _Probe(stream_ptr, _current_test[0])
    self._probe_stream = stream_ptr
    sys.settrace(probe.tracer)
    threading.settrace(probe.tracer)
    return result


def _exit(self, *exc):
    sys.settrace(None)
    threading.settrace(None)
    if GC_OFF:
        gc.enable()
    status = _status(self._probe_stream)
    _write(f"[{_current_test[0]}] capture ends, status {status}, exception {exc[0]}")
    return _original_exit(self, *exc)


torch.cuda.graph.__enter__, torch.cuda.graph.__exit__ = _enter, _exit
gc.callbacks.append(_on_gc)


def pytest_runtest_setup(item):
    _current_test[0] = item.nodeid
