"""minillm.kernels: numba kernels, one family per file, each as a CUDA kernel (@cuda.jit) with its
launcher and a CPU twin (@njit).

    matmul.py           tiled matmul with shared memory (y = x W^T), and GEMV; matmul_naive.py; the CPU
                        twin's register-blocked micro-kernels (LLVM vector code) and linear_rows_plain, the
                        same maths as three plain loops (llama2.c's matmul), their reference
    rmsnorm.py          RMSNorm, and fused residual-add + RMSNorm
    rope.py             rotary embedding in llama2.c's pair layout
    softmax.py          three-pass (block reduction) and online softmax; exp32, the CPU twins' vectorising exp
    swiglu.py           fused SiLU(gate) * up
    flash_attention.py  FlashAttention forward (tiles, online softmax, causal); FLAT; naive reference
    paged_attention.py  decode attention through block tables; flash-decoding
    quant_gemv.py       int8 and int4 dequantizing GEMV in DESIGN.md's layouts
    quant_rows.py       the CPU fast path's quantized matmuls (int8, int4, Q8_0, W8A8) and int8-KV attention,
                        one file per weight type (quant_rows_int8, _int4, _q80, _w8a8, _kv_int8; shared: _tiles)
    block_reduce.py     block_sum / block_max, the shared-memory tree reduction the kernels above call
    sparse24.py         the 2:4 compressed layout (values + 2-bit indices) and its GEMV
    access_trace.py     records which simulated thread touches which element (a tool, no kernel)

The CUDA side runs on a real GPU, or in numba's CUDA simulator on any CPU (slowly: every thread is a
Python thread; use it for learning and for tests at small shapes). numba decides which, once, when
`numba.cuda` is first imported (the NUMBA_ENABLE_CUDASIM variable), so nothing here imports it until
a kernel is launched or compiled: call `use_simulator()` first in a notebook or test that wants it.

A CUDA kernel is written as a plain function decorated with `@cuda_kernel(signatures...)`. Its body
uses the name `cuda` as numba's CUDA module does (`cuda.grid`, `cuda.shared.array`); the module's
global `cuda` is bound to `numba.cuda` when the kernel is first compiled. The signatures are what
the PTX test compiles for sm_80 and sm_90 without a GPU (tests/test_kernels_ptx.py). A device function
that kernels call is decorated with `@cuda_device` and compiled with the first kernel that calls it.

Layer rule (DESIGN.md): this package imports numpy and numba, and torch only to accept tensors.
"""
from __future__ import annotations

import os
import sys

import numpy as np

KERNELS: dict[str, "CudaKernel"] = {}   # every CUDA kernel in the package, by qualified name


# ----------------------------------------------------------------------------- simulator or GPU

def use_simulator(on: bool = True) -> None:
    """Run CUDA kernels in numba's simulator (on=True) or on a real GPU (on=False). numba reads the
    choice once, when numba.cuda is first imported; asking for the other one afterwards raises."""
    if "numba.cuda" in sys.modules:
        if simulating() != on:
            raise RuntimeError(f"numba.cuda is already imported with the simulator {'on' if simulating() else 'off'}; "
                               "call use_simulator() before the first kernel runs (restart the kernel/process)")
        return
    os.environ["NUMBA_ENABLE_CUDASIM"] = "1" if on else "0"
    if "numba" in sys.modules:          # numba read its config at import: make it read the variable again
        from numba.core import config
        config.reload_config()


def simulating() -> bool:
    """Whether CUDA kernels run (or will run) in the simulator."""
    if "numba.cuda" in sys.modules:
        from numba import config
        return bool(config.ENABLE_CUDASIM)
    return os.environ.get("NUMBA_ENABLE_CUDASIM", "0") == "1"


def cuda():
    """numba.cuda, imported on first use (that import fixes simulator or GPU for the process)."""
    from numba import cuda as numba_cuda
    return numba_cuda


def gpu_available() -> bool:
    """A real CUDA GPU that numba can use (never true in the simulator)."""
    if simulating():
        return False
    try:
        return bool(cuda().is_available())
    except Exception:  # no driver, no numba-cuda: no GPU
        return False


# ----------------------------------------------------------------------------- lazy CUDA kernels

class CudaKernel:
    """A @cuda.jit kernel compiled on first launch. `kernel[grid, block](*args)` launches it;
    `.py_func` is the Python source (what the simulator runs and compile_ptx compiles);
    `.signatures` are the argument types it is compiled for ahead of time in the PTX test."""

    def __init__(self, fn, signatures: tuple[str, ...]):
        self.py_func, self.signatures, self._compiled = fn, signatures, None
        self.__name__, self.__doc__ = fn.__name__, fn.__doc__
        KERNELS[f"{fn.__module__}.{fn.__name__}"] = self

    def _bind(self):
        _bind_globals(self.py_func)
        return cuda()

    def compiled(self):
        if self._compiled is None:
            self._compiled = self._bind().jit(self.py_func)
        return self._compiled

    def __getitem__(self, launch):
        return self.compiled()[launch]

    def compile_ptx(self, cc: tuple[int, int]) -> list[str]:
        """PTX for each signature on compute capability cc, without a GPU (needs NVVM, not the simulator)."""
        c = self._bind()
        return [c.compile_ptx(self.py_func, sig, cc=cc)[0] for sig in self.signatures]


class CudaDevice:
    """A @cuda.jit(device=True) helper that kernels call (kernels/block_reduce.py), compiled when the first
    kernel that calls it is: `.py_func` is its Python source, `.compiled()` the numba device function.
    It is inlined into each caller at numba's IR level (inline="always", as nvcc inlines a small __device__
    function): besides costing no call, that lets compile_ptx build a kernel that calls it with no GPU present
    (a separately compiled device function asks the driver for the current device's compute capability)."""

    def __init__(self, fn):
        self.py_func, self._compiled = fn, None
        self.__name__, self.__doc__ = fn.__name__, fn.__doc__

    def compiled(self):
        if self._compiled is None:
            _bind_globals(self.py_func)
            self._compiled = cuda().jit(device=True, inline="always")(self.py_func)
        return self._compiled


def cuda_device(fn):
    """Decorator: a CUDA device function, compiled lazily (like cuda_kernel, it imports no numba.cuda)."""
    return CudaDevice(fn)


def _bind_globals(fn) -> None:
    """Before fn is compiled: its module's `cuda` becomes numba.cuda, and each device helper fn calls by a
    global name becomes the compiled device function (numba can only call those). Only names fn's own code
    reads are looked at: compiling a kernel compiles the helpers it calls, and no others."""
    g = fn.__globals__
    g["cuda"] = cuda()
    for name in fn.__code__.co_names:
        if isinstance(g.get(name), CudaDevice):
            g[name] = g[name].compiled()


def cuda_kernel(*signatures: str):
    """Decorator: a CUDA kernel, compiled lazily; `signatures` (numba type strings) for the PTX test."""
    if not signatures:
        raise ValueError("a CUDA kernel needs at least one signature for the PTX compile test")
    return lambda fn: CudaKernel(fn, signatures)


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for integers a >= 0, b > 0, exactly (no float): the number of size-b pieces that cover a
    items. Host code only; device code writes (a + b - 1) // b itself."""
    return -(-a // b)


def blocks(n: int, per_block: int) -> int:
    """How many blocks of `per_block` cover n items: computed from the problem size, never from gridDim."""
    return max(1, cdiv(n, per_block))


# ----------------------------------------------------------------------------- arrays in, arrays out

def check_array(name: str, x, dtype, ndim: int, shape: tuple | None = None):
    """The launcher's guard, before any kernel runs: right dtype, rank, shape (None entries are free)
    and C-contiguous, or a ValueError that names the argument and what was expected."""
    if getattr(x, "dtype", None) is None or not hasattr(x, "shape"):
        raise ValueError(f"{name} must be an array (numpy, torch or CUDA device array), got {type(x).__name__}")
    try:
        dt = np.dtype(str(x.dtype).replace("torch.", ""))
    except TypeError:                    # e.g. torch.bfloat16, which numpy has no name for
        raise ValueError(f"{name} must be {np.dtype(dtype).name}, got {x.dtype}") from None
    if dt != np.dtype(dtype):
        raise ValueError(f"{name} must be {np.dtype(dtype).name}, got {dt.name}")
    if len(x.shape) != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {tuple(x.shape)}")
    if shape is not None:
        for i, (got, want) in enumerate(zip(x.shape, shape)):
            if want is not None and got != want:
                raise ValueError(f"{name} has shape {tuple(x.shape)}: dimension {i} must be {want}")
    if not _contiguous(x):
        raise ValueError(f"{name} must be C-contiguous (call .contiguous() / np.ascontiguousarray first)")
    return x


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _contiguous(x) -> bool:
    if _is_torch(x):
        return x.is_contiguous()
    if isinstance(x, np.ndarray):
        return x.flags.c_contiguous
    return bool(getattr(x, "is_c_contiguous", lambda: True)())


def to_device(x):
    """What a kernel launch takes: a torch CUDA tensor becomes a zero-copy view through
    __cuda_array_interface__; numpy arrays and device arrays pass as they are (on a real GPU numba
    copies a numpy argument to the device and back; the simulator runs on it in place)."""
    if _is_torch(x):
        if x.is_cuda:
            return cuda().as_cuda_array(x.detach())
        return x.detach().numpy()
    return x


def empty_like(x, shape, dtype=np.float32):
    """An output array on the same side as x: a torch tensor on x's device, or a numpy array."""
    if _is_torch(x):
        import torch
        return torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name), device=x.device)
    if hasattr(x, "copy_to_host"):      # a numba device array
        return cuda().device_array(shape, dtype=dtype)
    return np.empty(shape, dtype=dtype)
