"""The harness notebook 03's kernel checkers share (minillm.labs.nb03_kernels): launch the reader's kernel in the
emulator (cuda_emulator.run_kernel), name what went wrong (a race, uninitialised shared memory, out of range,
divergent syncthreads) and keep the launch for drawing (Picture, in each result's .drawing)."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .common import DRAWINGS
from .cuda_emulator import KernelRun, OutOfRange, _elem, _on_gpu, _who, run_kernel

# ----------------------------------------------------------------------------- naming what went wrong

def _first_race(run: KernelRun):
    """(earlier access, later access) of the first conflict, or None. Shared memory: two threads of a block
    in one phase, one of them writing. Global memory: the same, or two different blocks at any time."""
    log, seen = run.log, {}
    for e, ph in zip(log.events, run.phases):
        shared = log.spaces[e.array] == "shared"
        key = (e.array, e.index, e.block) if shared else (e.array, e.index)
        reads, writes = seen.setdefault(key, ([], []))
        others = writes if e.kind == "read" else writes + reads
        for o, oph in others:
            if (o.block, o.thread) != (e.block, e.thread) and (oph == ph or o.block != e.block):
                return o, e
        (reads if e.kind == "read" else writes).append((e, ph))
    return None


def _first_uninitialised(run: KernelRun):
    """The first read of a shared slot that no thread of the block had written before."""
    written = set()
    for e in run.log.events:
        if run.log.spaces[e.array] != "shared":
            continue
        key = (e.block, e.array, e.index)
        if e.kind == "write":
            written.add(key)
        elif key not in written:
            return e
    return None


@dataclass
class Picture:
    """What draw_puzzle draws for a checker: a launch's log, the arrays to show, one thread to outline
    ((blockIdx, threadIdx), or None: the first thread), the case, what it shows, and whether it passed."""
    log: object
    arrays: list
    thread: tuple | None
    where: str
    label: str
    passed: bool


PICTURES: dict[str, Picture] = DRAWINGS     # each result carries its checker's picture (ExerciseResult.drawing)


def last_picture(name: str) -> Picture | None:
    """The launch a checker kept for drawing: the failing one, or the one it shows on a pass."""
    return PICTURES.get(name)


def _keep(name, run, arrays, thread, where, label, passed=False):
    PICTURES[name] = Picture(run.log, [a for a in arrays if a in run.log.shapes], thread, where, label, passed)


def _fail(name, run, arrays, thread, where, label, msg):
    """Keep the failing launch for the picture (thread outlined), then fail with `where: msg`."""
    _keep(name, run, arrays, thread, where, label)
    raise AssertionError(f"{where}: {msg}")


def _launch(name, fn, griddim, blockdim, args, *, where, arrays, show=None, hints=None) -> KernelRun:
    """Run the reader's kernel on one case and fail, naming the mistake, on anything but a clean run: an
    exception, an index out of range, a value returned, a race, a divergent syncthreads, a read of
    uninitialised shared memory. hints: {"range": fn(OutOfRange) -> str, "race": str, "diverge": str,
    "uninit": str}, the puzzle's advice. show: (block, thread) to outline when this case is the one drawn."""
    hints = hints or {}

    def more(key):
        return f"; {hints[key]}" if key in hints else ""
    run = run_kernel(fn, griddim, blockdim, *args)
    log = run.log

    def fail(label, msg, at):
        _fail(name, run, arrays, at, where, label, msg)
    if run.error is not None:
        e, (b, t) = run.error, run.error_at
        if isinstance(e, OutOfRange):
            hint, at = hints.get("range", lambda e: "")(e), f"{e.array}[{', '.join(map(str, e.index))}]"
            fail(f"{at} out of range", f"{_who(log, b, t)} {e.kind}s {at}, outside {e.array} (shape {e.shape})"
                 f"{': ' + hint if hint else ''}", (b, t))
        if isinstance(e, NotImplementedError):
            raise e
        try:
            named = type(e)(f"{_who(log, b, t)}: {e}")
        except Exception:  # noqa: BLE001 - an exception type that wants other arguments: as it is
            raise e from None
        raise named from None
    if run.returned is not None:
        b, t, v = run.returned
        fail("returned a value", f"{_who(log, b, t)} returned {v!r:.40}: a CUDA kernel returns nothing, it writes "
             "its results into an output array", (b, t))
    race = _first_race(run)
    if race:
        o, e = race
        space = log.spaces[e.array]
        if o.kind == e.kind == "write":
            what = (f"{_who(log, o.block, o.thread)} and {_who(log, e.block, e.thread)} both write "
                    f"{_elem(log, e.array, e.index)} ({space} memory): a race, whichever writes last wins")
        else:
            r, w = (o, e) if o.kind == "read" else (e, o)
            what = (f"{_who(log, r.block, r.thread)} reads {_elem(log, e.array, e.index)} and "
                    f"{_who(log, w.block, w.thread)} writes it ({space} memory) " +
                    ("with no cuda.syncthreads() between them: a race (on a GPU either may come first)"
                     if o.block == e.block else "(blocks never wait for each other: a race)"))
        fail(f"a race on {_elem(log, e.array, e.index)}",
             f"{what}; {hints.get('race', 'call cuda.syncthreads() between them')}", (e.block, e.thread))
    if run.divergent:
        fail("divergent syncthreads", f"divergent cuda.syncthreads(): {run.divergent}; every thread of a block must "
             f"reach every syncthreads, so keep it outside if-branches and loops that not all threads run"
             f"{more('diverge')}", None)
    e = _first_uninitialised(run)
    if e is not None:
        fail(f"{_elem(log, e.array, e.index)} read uninitialised",
             f"{_who(log, e.block, e.thread)} reads {_elem(log, e.array, e.index)} before any thread of its block "
             f"wrote it (uninitialised shared memory, garbage on a GPU){more('uninit')}",
             (e.block, e.thread))
    if show is not None:
        _keep(name, run, arrays, show, where, "what each thread touched", passed=True)
    return run


def _compare(name, run, got, want, where, what, arrays, atol=1e-5):
    """Values against the numpy reference: first the outputs never written (still NaN), then wrong ones."""
    missed = np.argwhere(np.isnan(got))
    if len(missed):
        first = ", ".join(str(int(i)) for i in missed[0])
        _fail(name, run, arrays, None, where, "outputs never written",
              f"{len(missed)} of {got.size} outputs never written, e.g. {what}[{first}]")
    bad = np.argwhere(~np.isclose(got, want, rtol=1e-4, atol=atol))
    if len(bad):
        i = tuple(int(j) for j in bad[0])
        _fail(name, run, arrays, None, where, "wrong values", f"{len(bad)} of {got.size} outputs wrong, e.g. "
              f"{what}[{', '.join(map(str, i))}] = {got[i]:.4g}, expected {want[i]:.4g}")


def _gpu_agrees(fn, griddim, blockdim, args, out_index, want, where):
    """On a GPU, the kernel launched for real gives what the emulator gave."""
    copies = _on_gpu(fn, griddim, blockdim, args, out_index)
    if copies is not None:
        got = copies[out_index]
        bad = ~np.isclose(got, want, rtol=1e-4, atol=1e-5)
        assert not bad.any(), (f"{where}: right in the checker's emulator, wrong on the GPU: {int(bad.sum())} of "
                               f"{got.size} outputs ({int(np.isnan(got).sum())} never written)")


def _times(n) -> str:
    return {1: "once", 2: "twice"}.get(int(n), f"{int(n)} times")


def _blocks(n, per_block):
    from minillm.kernels import blocks
    return blocks(n, per_block)
