"""The grader's fences: each exercise in its own process, the engine and the checkers untouched, no answer imported.

`make grade` must give marks a teacher can trust, so a submission cannot reach beyond its own exercise:

- **its own process**: each exercise cell runs in a fresh process forked from a clean server that has imported
  minillm.labs and nothing of any student (multiprocessing's forkserver; spawn where there is none), so a cell
  that replaces a checker, or the engine, changes nothing for the next exercise;
- **no patching**: the child notes every attribute of minillm's modules (and torch's, numpy's) before the cell runs
  and compares after the cell and after the checker: a cell that redefines a checker or monkeypatches the engine
  fails, naming what it changed;
- **no imported answer**: the cell may import from minillm only what its checker allows (`checker(allow=...)`:
  a base class to extend, a helper the exercise builds on); the engine's own implementation, imported or
  assigned, fails naming it (the checker itself refuses a function whose module is minillm's, in a notebook too).
"""
from __future__ import annotations

import ast
import multiprocessing as mp
import sys

WATCHED = ("minillm", "torch", "torch.nn.functional", "numpy")   # prefixes of the modules a cell must leave alone
PRELOAD = ["minillm.labs"]


def forbidden_imports(cell: str, allow: tuple = ()) -> list[str]:
    """The minillm names a cell imports that its checker does not allow ("minillm.core.verify.verify_row"; from
    minillm.labs only its check_ functions), and dynamic imports (importlib, __import__), which reach any."""
    try:
        tree = ast.parse(cell)
    except SyntaxError:
        return []                                                  # the cell's own run reports it
    bad = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "minillm":
            bad += [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" not in allow
                    and not (node.module == "minillm.labs" and a.name.startswith("check_"))]
        elif isinstance(node, ast.Import):
            bad += [a.name for a in node.names if a.name.split(".")[0] == "minillm" and a.name not in allow]
            bad += [a.name for a in node.names if a.name == "importlib"]
        elif isinstance(node, ast.Name) and node.id == "__import__":
            bad.append("__import__")
    return bad


def snapshot() -> dict:
    """{module: {attribute: id(value)}} of the functions and classes of the watched modules now loaded (what a
    patch replaces; module state such as a cached thread count may change)."""
    mods = {n: m for n, m in list(sys.modules.items())
            if m is not None and (n in WATCHED or n.startswith("minillm."))}
    return {n: {k: id(v) for k, v in list(vars(m).items()) if callable(v)} for n, m in mods.items()}


def changed(before: dict, after: dict, only: str = "") -> list[str]:
    """What a cell rebound or deleted in modules that were loaded before it ran (new modules, new names: fine);
    only: of the modules whose names start so (after a checker ran: torch patches itself as it loads parts of
    itself, e.g. torch._dynamo wrapping torch.manual_seed)."""
    out = []
    for mod, attrs in before.items():
        if not mod.startswith(only):
            continue
        now = after.get(mod, {})
        out += [f"{mod}.{k}" for k, v in attrs.items() if now.get(k) != v and not k.startswith("__")]
    return out


def context():
    if "forkserver" in mp.get_all_start_methods():
        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        return ctx
    return mp.get_context("spawn")


def run_apart(target, args: tuple, timeout_s: float) -> dict:
    """target(*args, conn) in a fresh process -> the dict it sent back, or a failing row's fields if the process
    died or outlived timeout_s."""
    ctx = context()
    here, there = ctx.Pipe(duplex=False)
    p = ctx.Process(target=target, args=(*args, there))          # not a daemon: a checker may start ranks
    p.start()
    there.close()
    try:
        if here.poll(timeout_s):
            return here.recv()
        return {"passed": False, "message": f"the exercise's process gave no answer within {timeout_s:.0f} s"}
    except EOFError:
        p.join(5)
        return {"passed": False, "message": f"the exercise's process died (exit code {p.exitcode}): a crash, or "
                                            "the cell ended the interpreter"}
    finally:
        if p.is_alive():
            p.kill()
        p.join(5)
        here.close()
