"""Benchmarks and profiling: `python -m minillm bench ...` (cli.py) for decode, batched decode, serving,
quantization and speculative decoding, each ratio measured side by side in one run; the forward profile, the
roofline, serving workloads, and what machine a number was measured on (sysinfo)."""

_MOVED = {"bench_decode": "decode", "bench_batched": "decode", "runc_tok_s": "decode", "matmul_flops": "decode",
          "numba_profile": "decode", "bench_serve": "serve", "main": "cli"}


def __getattr__(name):
    """minillm.bench was one module before the subpackages: its functions still resolve, with a warning."""
    if name not in _MOVED:
        raise AttributeError(f"module 'minillm.bench' has no attribute {name!r}")
    import importlib
    import warnings
    warnings.warn(f"minillm.bench.{name} moved to minillm.bench.{_MOVED[name]}.{name}", DeprecationWarning,
                  stacklevel=2)
    return getattr(importlib.import_module(f"minillm.bench.{_MOVED[name]}"), name)
