"""A deterministic CUDA emulator for the kernel puzzles: `run_kernel(fn, grid, block, *args)`.

It runs a CUDA kernel body in plain Python, one CUDA thread at a time, in a fixed order, as numba's
simulator would but deterministically. Each thread is a Python thread that runs only when the scheduler
hands it the turn: thread 0, 1, 2... of a block run until they reach `cuda.syncthreads()` (or finish),
then the next phase starts. The arrays are the access recorder's proxies (minillm.kernels.access_trace),
so every read and write is logged with its thread and phase: the checkers in nb03_kernels.py turn that
log into named bugs (out of range, races, divergent syncthreads, uninitialised shared memory).
"""
from __future__ import annotations

import ctypes
import dis
import functools
import inspect
import itertools
import sys
import threading
import time
import types
from dataclasses import dataclass

import numpy as np

KERNEL_LIMIT_S = 10.0      # one emulated launch that takes longer is stopped (an endless loop?)


class _Dim3(tuple):
    """(x, y, z) with .x .y .z, as numba.cuda's threadIdx and friends."""
    x = property(lambda self: self[0])
    y = property(lambda self: self[1])
    z = property(lambda self: self[2])


class _Abort(BaseException):
    """Stops an emulated thread (a BaseException: the kernel's own `except Exception` does not swallow it)."""


class OutOfRange(IndexError):
    """An emulated thread indexed outside an array."""

    def __init__(self, array, index, shape, kind):
        self.array, self.index, self.shape, self.kind = array, index, shape, kind
        super().__init__(f"{kind} {array}[{', '.join(map(str, index))}] outside {array} (shape {shape})")


@functools.cache
def _checked_proxy():
    """The access recorder's array proxy, with CUDA's bounds: any index outside [0, size) is an error."""
    from minillm.kernels.access_trace import _Traced

    class Checked(_Traced):
        __slots__ = ()

        def _check(self, index, kind):
            idx = index if isinstance(index, tuple) else (index,)
            for d, i in enumerate(idx):
                if isinstance(i, (int, np.integer)) and d < self._a.ndim and not 0 <= i < self._a.shape[d]:
                    raise OutOfRange(self._name, tuple(int(j) if isinstance(j, (int, np.integer)) else j for j in idx),
                                     self._a.shape, kind)

        def __getitem__(self, index):
            self._check(index, "read")
            out = super().__getitem__(index)
            if isinstance(out, _Traced):          # a row of a 2-D array: checked too
                out.__class__ = Checked
            return out

        def __setitem__(self, index, value):
            self._check(index, "write")
            super().__setitem__(index, value)
    return Checked


def _stored_name(frame) -> str | None:
    """The variable the value being computed at `frame` is assigned to (`tile = cuda.shared.array(...)`),
    read from the bytecode, so it works without the source (a cell run by exec)."""
    for ins in dis.get_instructions(frame.f_code):
        if ins.offset > frame.f_lasti and ins.opname.startswith("STORE_"):
            return ins.argval if ins.opname in ("STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL") else None
    return None


def _np_dtype(dtype):
    try:
        from numba.np.numpy_support import as_dtype
        return as_dtype(dtype)
    except Exception:  # noqa: BLE001 - not a numba type: numpy's own names
        return np.dtype(dtype)


class _Memory:
    """cuda.shared / cuda.local for the emulated threads: one shared array per source line and block."""

    def __init__(self, launch, shared: bool):
        self._launch, self._shared = launch, shared

    def array(self, shape, dtype, alignment=None):
        dt = _np_dtype(dtype)
        if not self._shared:
            return np.zeros(shape, dt)
        launch, frame = self._launch, sys._getframe(1)
        key = (frame.f_code, frame.f_lineno)
        if key not in launch.shared:              # the first thread of the block to get here makes it
            a = np.full(shape, np.nan if dt.kind == "f" else np.iinfo(dt).min if dt.kind in "iu" else 0, dt)
            name = _stored_name(frame) or f"shared@{frame.f_lineno}"
            if launch.log.spaces.get(name, "shared") != "shared" or launch.shared_lines.get(name, key) != key:
                name = f"{name}@{frame.f_lineno}"
            launch.shared_lines[name] = key
            launch.log.shapes[name], launch.log.spaces[name] = a.shape, "shared"
            launch.shared[key] = launch.proxy(a, name, launch.note)
        return launch.shared[key]


class _FakeCuda:
    """numba.cuda as the emulated thread that has the turn sees it."""

    def __init__(self, launch, griddim, blockdim):
        self._launch = launch
        self.gridDim, self.blockDim = _Dim3(griddim), _Dim3(blockdim)
        self.blockIdx = self.threadIdx = _Dim3((0, 0, 0))
        self.shared, self.local = _Memory(launch, True), _Memory(launch, False)

    def grid(self, ndim):
        ids = [b * d + t for b, d, t in zip(self.blockIdx, self.blockDim, self.threadIdx)][:ndim]
        return ids[0] if ndim == 1 else tuple(ids)

    def gridsize(self, ndim):
        sizes = [g * d for g, d in zip(self.gridDim, self.blockDim)][:ndim]
        return sizes[0] if ndim == 1 else tuple(sizes)

    def syncthreads(self):
        self._launch.barrier(sys._getframe(1).f_lineno)

    def __getattr__(self, name):
        raise AttributeError(f"cuda.{name} is not available in the checker's emulator (this puzzle does not need it)")


class _CudaThread(threading.Thread):
    """One CUDA thread: runs the kernel when it has the turn, hands the turn back at each syncthreads."""

    def __init__(self, launch, fn, args, tid):
        super().__init__(daemon=True, name=f"cuda thread {tid}")
        self.launch, self.fn, self.args, self.tid = launch, fn, args, tid
        self.go = threading.Event()
        self.state = "ready"            # ready | barrier | done
        self.site = None                # the line of the syncthreads it waits at
        self.error = self.returned = None

    def run(self):
        try:
            try:
                self.go.wait()
                self.go.clear()
                if not self.launch.aborted:
                    self.returned = self.fn(*self.args)
            except _Abort:
                pass
            except BaseException as e:  # noqa: BLE001 - handed to the checker
                self.error = e
            finally:
                self.state = "done"
                self.launch.yielded.set()
        except _Abort:       # an interruption that landed after the kernel returned: nothing left to stop
            pass


@dataclass
class KernelRun:
    """What one emulated launch did: the access log (an access_trace.AccessLog), the phase of each event
    (a counter that moves on at every block start and every syncthreads), and what went wrong, if anything."""
    log: object
    phases: list
    error: BaseException | None = None
    error_at: tuple | None = None            # (blockIdx, threadIdx) of the thread that raised
    returned: tuple | None = None            # (blockIdx, threadIdx, value) of a thread that returned a value
    divergent: str | None = None             # a syncthreads not every thread of the block reached


class _Launch:
    def __init__(self, griddim, blockdim, deadline_s):
        from minillm.kernels.access_trace import Access, AccessLog, _wrap
        self.Access, self.wrap, self.Checked = Access, _wrap, _checked_proxy()
        self.log = AccessLog(griddim, blockdim)
        self.phases, self.phase = [], 0
        self.shared, self.shared_lines = {}, {}
        self.current, self.aborted = None, False
        self.yielded = threading.Event()
        self.limit_s, self.deadline = deadline_s, time.monotonic() + deadline_s
        self.fake = _FakeCuda(self, griddim, blockdim)

    def proxy(self, a, name, note):
        p = self.wrap(a, name, note)
        p.__class__ = self.Checked
        return p

    def note(self, name, index, kind):
        self.log.events.append(self.Access(self.fake.blockIdx, self.fake.threadIdx, name, index, kind))
        self.phases.append(self.phase)

    def barrier(self, site):                      # runs on the emulated thread that has the turn
        me = self.current
        me.state, me.site = "barrier", site
        self.yielded.set()
        me.go.wait()
        me.go.clear()
        if self.aborted:
            raise _Abort()

    def _turn(self, t):
        self._in_time()
        self.current, self.fake.threadIdx = t, _Dim3(t.tid)
        self.yielded.clear()
        t.go.set()
        while not self.yielded.wait(0.05):
            self._in_time()

    def _in_time(self):
        if time.monotonic() > self.deadline:
            raise AssertionError(f"the kernel ran for more than {self.limit_s:.0f} s on a launch with "
                                 f"{int(np.prod(self.log.griddim) * np.prod(self.log.blockdim))} threads "
                                 "and did not finish: an endless loop (a while loop whose condition never "
                                 "changes, a step that never reaches 0)?")

    def run_block(self, fn, args, block, run: KernelRun):
        self.fake.blockIdx, self.shared, self.aborted = _Dim3(block), {}, False
        self.phase += 1
        bx, by, bz = self.log.blockdim
        threads = [_CudaThread(self, fn, args, (x, y, z))
                   for z, y, x in itertools.product(range(bz), range(by), range(bx))]   # x fastest, as CUDA
        for t in threads:
            t.start()
        try:
            live = threads
            while live:
                for t in live:
                    self._turn(t)
                    if t.error is not None:
                        run.error, run.error_at = t.error, (block, t.tid)
                        return False
                    if t.returned is not None and run.returned is None:
                        run.returned = (block, t.tid, t.returned)
                live = [t for t in live if t.state == "barrier"]
                sites = sorted({t.site for t in live})
                gone = [t for t in threads if t.state == "done"]
                if live and run.divergent is None and (len(sites) > 1 or gone):
                    run.divergent = _divergence(self.log, block, live, gone, sites)
                for t in live:
                    t.state = "ready"
                self.phase += 1
            return True
        finally:
            self._stop(threads)

    def _stop(self, threads):
        """Every emulated thread of the block ends: woken with the abort flag, or, if it is running (an
        endless loop past the deadline), interrupted with an asynchronous exception."""
        pending = [t for t in threads if t.state != "done"]
        if pending:
            self.aborted = True
            for t in pending:
                if t.is_alive():
                    if t is self.current and t.state == "ready":
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(t.ident), ctypes.py_object(_Abort))
                    t.go.set()
        for t in threads:
            t.join(1.0)


def _as_emulated(fn, fake):
    """fn with its `cuda` global (numba.cuda) replaced by the emulator's, in a copy of its globals: the
    reader's namespace is left as it was."""
    fn = getattr(fn, "py_func", fn)             # a cuda.jit kernel: its Python body
    if not isinstance(fn, types.FunctionType):
        raise TypeError(f"expected a kernel written as a Python function, got {type(fn).__name__}")
    real = sys.modules.get("numba.cuda")
    globs = dict(fn.__globals__)
    for k, v in fn.__globals__.items():
        if k == "cuda" or (real is not None and v is real):
            globs[k] = fake
    return types.FunctionType(fn.__code__, globs, fn.__name__, fn.__defaults__, fn.__closure__)


def _pad(d) -> tuple:
    d = (d,) if isinstance(d, (int, np.integer)) else tuple(d)
    return tuple(int(i) for i in d) + (1,) * (3 - len(d))


def run_kernel(fn, griddim, blockdim, *args) -> KernelRun:
    """Run fn[griddim, blockdim](*args) in the emulator (module docstring). numpy arrays are written in
    place; the returned KernelRun says what happened. Raises nothing the kernel raises: see .error."""
    griddim, blockdim = _pad(griddim), _pad(blockdim)
    launch = _Launch(griddim, blockdim, KERNEL_LIMIT_S)
    names = list(inspect.signature(getattr(fn, "py_func", fn)).parameters)
    wrapped = []
    for name, a in zip(names, args):
        if isinstance(a, np.ndarray) and a.ndim > 0:
            launch.log.shapes[name], launch.log.spaces[name] = a.shape, "global"
            a = launch.proxy(a, name, launch.note)
        wrapped.append(a)
    body = _as_emulated(fn, launch.fake)
    run = KernelRun(launch.log, launch.phases)
    for b in itertools.product(*(range(n) for n in reversed(griddim))):
        if not launch.run_block(body, wrapped, tuple(reversed(b)), run):
            break
    return run


def _on_gpu(fn, griddim, blockdim, args, out_index):
    """The real launch, on a GPU only (the simulator adds nothing to the emulator): copies of the arrays go
    in, the output starting as NaN (what the kernel leaves unwritten stays NaN); the copies come back."""
    from minillm.kernels import cuda, gpu_available
    if not gpu_available():
        return None
    copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
    copies[out_index].fill(np.nan)
    cuda().jit(getattr(fn, "py_func", fn))[_pad(griddim), _pad(blockdim)](*copies)
    return copies


# ----------------------------------------------------------------------------- who and where, in words

def _ndim(d) -> int:
    return max([i + 1 for i, n in enumerate(d) if n > 1] or [1])


def _who(log, block, thread) -> str:
    """'thread 2 of block 1 (i = 6)' for a 1-D launch, 'thread (1, 3) of block (0, 1)' for a 2-D one."""
    nb, nt = _ndim(log.griddim), _ndim(log.blockdim)
    b = block[0] if nb == 1 else tuple(block[:nb])
    t = thread[0] if nt == 1 else tuple(thread[:nt])
    flat = nb == nt == 1 and all(len(s) == 1 for a, s in log.shapes.items() if log.spaces[a] == "global")
    glob = f" (i = {block[0] * log.blockdim[0] + thread[0]})" if flat and log.griddim[0] > 1 else ""
    return f"thread {t} of block {b}{glob}"


def _elem(log, array, flat) -> str:
    idx = np.unravel_index(flat, log.shapes[array])
    return f"{array}[{', '.join(str(int(i)) for i in idx)}]"


def _divergence(log, block, waiting, gone, sites) -> str:
    w = waiting[0]
    if gone:
        return (f"block {block[0] if _ndim(log.griddim) == 1 else block[:_ndim(log.griddim)]}: "
                f"{_who(log, block, gone[0].tid).split(' of ')[0]} finished (returned) while "
                f"{_who(log, block, w.tid).split(' of ')[0]} waits at cuda.syncthreads() (line {w.site})")
    return f"threads of block {block} wait at different cuda.syncthreads() calls (lines {', '.join(map(str, sites))})"
