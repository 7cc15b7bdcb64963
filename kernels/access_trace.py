"""Who reads what: run a CUDA kernel in numba's simulator on a tiny shape and record, for every thread,
each element it reads or writes, in global or in shared memory (the picture GPU-Puzzles draws by hand).

Why: "tiling cuts global reads by TILE" is the whole argument for shared memory (Kirk & Hwu ch. 5),
and it is a count, so we count it. record_accesses(matmul_tiled, ...) and the same call on
matmul_naive show each element of x read ceil(N/TILE) times against N times.

How: in the simulator every CUDA thread is a Python thread (numba's simulator/kernel.py BlockThread,
which carries its own blockIdx and threadIdx). We hand the kernel proxies instead of numpy arrays;
their __getitem__/__setitem__ log (block, thread, array, element, read/write) and then touch the real
array. cuda.shared.array is patched for the duration of the launch so shared tiles come back as
proxies too. The simulator only: on a GPU no Python runs per thread, so there is nothing to hook.

A tool for looking at kernels, not a kernel family: it defines no CUDA kernel of its own.
"""
from __future__ import annotations

import inspect
import linecache
import re
import sys
import threading
from dataclasses import dataclass, field

import numpy as np

from . import cuda, simulating, to_device

_ONE_AT_A_TIME = threading.Lock()     # the shared-array patch is process-wide: one recording at a time
_SHARED_NAME = re.compile(r"(\w+)\s*=\s*cuda\.shared\.array")


# ----------------------------------------------------------------------------- the log

@dataclass(frozen=True, slots=True)
class Access:
    """One element touched by one thread."""
    block: tuple        # blockIdx (x, y, z)
    thread: tuple       # threadIdx (x, y, z)
    array: str          # the kernel's parameter name, or the shared array's variable name
    index: int          # flat (C-order) index of the element in that array
    kind: str           # "read" or "write"


@dataclass
class AccessLog:
    """Every access of one launch, in the order the simulator ran them, plus what is needed to draw
    them: each array's shape and memory space ("global" for arguments, "shared" for shared arrays)."""
    griddim: tuple
    blockdim: tuple
    shapes: dict = field(default_factory=dict)      # array name -> shape
    spaces: dict = field(default_factory=dict)      # array name -> "global" | "shared"
    events: list = field(default_factory=list)      # Access, in the order they happened

    def _counts(self, array: str, kind: str) -> np.ndarray:
        if array not in self.shapes:
            raise ValueError(f"no array named {array!r} in this log; arrays: {', '.join(self.shapes)}")
        flat = np.zeros(int(np.prod(self.shapes[array])), np.int64)
        np.add.at(flat, [e.index for e in self.events if e.array == array and e.kind == kind], 1)
        return flat.reshape(self.shapes[array])

    def reads_per_element(self, array: str) -> np.ndarray:
        """How many times each element of `array` was read, by all threads of all blocks (array's shape)."""
        return self._counts(array, "read")

    def writes_per_element(self, array: str) -> np.ndarray:
        return self._counts(array, "write")

    def _total(self, space: str, kind: str) -> int:
        return sum(1 for e in self.events if e.kind == kind and self.spaces[e.array] == space)

    @property
    def global_reads_total(self) -> int:
        """Element reads from global memory (DRAM on a real GPU, modulo caches): what tiling reduces."""
        return self._total("global", "read")

    @property
    def shared_reads_total(self) -> int:
        """Element reads from shared memory (on-chip): what tiling trades the global reads for."""
        return self._total("shared", "read")

    def thread_events(self, block, thread) -> list:
        """The accesses of one thread, in order. block and thread: an int (x) or a tuple (x, y[, z])."""
        b, t = _dim3(block), _dim3(thread)
        return [e for e in self.events if e.block == b and e.thread == t]

    def touched(self, array: str, block, thread, kind: str = "read") -> list:
        """The elements (index tuples into `array`) one thread touched, each once, in first-touch order."""
        flat = dict.fromkeys(e.index for e in self.thread_events(block, thread) if e.array == array and e.kind == kind)
        return [tuple(int(i) for i in np.unravel_index(f, self.shapes[array])) for f in flat]


def _dim3(v, fill: int = 0) -> tuple:
    """(x, y, z) from an int or a shorter tuple: missing indices are 0, missing dimensions 1."""
    v = (v,) if isinstance(v, (int, np.integer)) else tuple(v)
    if not 1 <= len(v) <= 3:
        raise ValueError(f"a grid, block or thread index has 1 to 3 components, got {v!r}")
    return tuple(int(i) for i in v) + (fill,) * (3 - len(v))


# ----------------------------------------------------------------------------- arrays that log

class _Traced:
    """A numpy array seen through a logging lens. `ids` holds each element's flat index in the array
    the log names, so a view (x[m] of a 2-D x) logs the elements of x it touches, not its own."""
    __slots__ = ("_a", "_ids", "_name", "_log")

    def __init__(self, a: np.ndarray, ids: np.ndarray, name: str, log):
        self._a, self._ids, self._name, self._log = a, ids, name, log

    shape = property(lambda self: self._a.shape)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    dtype = property(lambda self: self._a.dtype)

    def __len__(self):
        return len(self._a)

    def __getattr__(self, name):          # anything else (strides, itemsize, ...) from the array itself
        return getattr(self._a, name)

    def __getitem__(self, index):
        out = self._a[index]
        if isinstance(out, np.ndarray):   # a row or a slice: logged when its elements are touched
            return _Traced(out, self._ids[index], self._name, self._log)
        self._log(self._name, int(self._ids[index]), "read")
        return out

    def __setitem__(self, index, value):
        self._a[index] = value._a if isinstance(value, _Traced) else value
        for i in np.ravel(self._ids[index]):
            self._log(self._name, int(i), "write")


def _wrap(a: np.ndarray, name: str, log) -> _Traced:
    return _Traced(a, np.arange(a.size).reshape(a.shape), name, log)


def _shared_name(filename: str, lineno: int, taken: dict) -> str:
    """The variable a shared array is assigned to on its source line (xs = cuda.shared.array(...))."""
    found = _SHARED_NAME.search(linecache.getline(filename, lineno))
    name = found.group(1) if found else f"shared@{lineno}"
    return name if taken.get(name, (filename, lineno)) == (filename, lineno) else f"{name}@{lineno}"


# ----------------------------------------------------------------------------- recording one launch

def record_accesses(kernel, griddim, blockdim, *args) -> AccessLog:
    """Launch `kernel[griddim, blockdim](*args)` in the CUDA simulator and log every element access.

    kernel: a minillm.kernels CudaKernel, a simulator @cuda.jit kernel, or a plain function written
    against numba.cuda. args: numpy arrays or CPU tensors (logged under the kernel's parameter names;
    written in place, as a launch would) and scalars. Keep shapes tiny: every thread is a Python thread."""
    if not simulating():
        raise RuntimeError("record_accesses needs numba's CUDA simulator (every thread is a Python thread we can "
                           "watch; on a GPU there is none): call minillm.kernels.use_simulator() before numba.cuda is "
                           "first imported, or set NUMBA_ENABLE_CUDASIM=1")
    from numba.cuda.simulator import kernelapi

    if hasattr(kernel, "compiled"):                  # a minillm CudaKernel: binds `cuda`, jits in the simulator
        fn, runner = kernel.py_func, kernel.compiled()
    elif hasattr(kernel, "py_func"):                 # already @cuda.jit (simulator)
        fn, runner = kernel.py_func, kernel
    else:
        fn, runner = kernel, cuda().jit(kernel)
    names = list(inspect.signature(fn).parameters)
    if len(args) != len(names):
        raise ValueError(f"{fn.__name__} takes {len(names)} arguments ({', '.join(names)}), got {len(args)}")

    griddim, blockdim = _dim3(griddim, 1), _dim3(blockdim, 1)
    log = AccessLog(griddim, blockdim)
    events = log.events

    def note(name, index, kind):                     # list.append is atomic under the GIL
        t = threading.current_thread()
        block, thread = getattr(t, "blockIdx", (-1, -1, -1)), getattr(t, "threadIdx", (-1, -1, -1))
        events.append(Access(tuple(block), tuple(thread), name, index, kind))

    wrapped = []
    for name, a in zip(names, args):
        a = to_device(a)                             # a CPU torch tensor: its numpy view (written in place)
        if isinstance(a, np.ndarray) and a.ndim > 0:
            log.shapes[name], log.spaces[name] = a.shape, "global"
            a = _wrap(a, name, note)
        wrapped.append(a)

    original = kernelapi.FakeCUDAShared.array
    made, made_lock = {}, threading.Lock()           # (file, line) -> proxy: one shared array per source line
    names_at: dict = {}                              # (file, line) -> the shared array's name in the log

    def shared_array(self, shape, dtype, alignment=None):
        # numba keys shared arrays by the caller's (file, line), so every thread of the block gets the
        # same one; wrapping its function would make *our* line the key, so we keep the key ourselves.
        # One buffer per line serves every block: correct only because the simulator runs the blocks
        # one after another (a block's threads are done with it before the next block starts).
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with made_lock:
            if key not in made:
                if shape == 0:                       # dynamic shared memory: numba's own buffer
                    arr = original(self, shape, dtype, alignment)
                else:
                    arr = np.empty(shape, kernelapi.numpy_support.as_dtype(dtype)
                                   if isinstance(dtype, kernelapi.types.Type) else dtype)
                name = names_at[key] = _shared_name(*key, {v: k for k, v in names_at.items()})
                log.shapes[name], log.spaces[name] = arr.shape, "shared"
                made[key] = _wrap(arr, name, note)
        return made[key]

    with _ONE_AT_A_TIME:
        kernelapi.FakeCUDAShared.array = shared_array
        try:
            runner[griddim, blockdim](*wrapped)
        finally:
            kernelapi.FakeCUDAShared.array = original
    return log
