"""Ranks from any main: what a spawned rank imports of the user's main module before it runs its loop.

multiprocessing's "spawn" starts a child by re-running the parent's main module (as `__mp_main__`), so that
functions defined there can be sent to it. That works for a script whose work sits under
`if __name__ == "__main__":`. It fails for a main that cannot be run again (standard input: `python - <<EOF`,
`python -c`, whose `__file__` names no file), and a script without that guard would start the ranks again from
inside each rank. For those, the main module is hidden from the children while they start (`hidden_main`): a rank
then runs from minillm's own modules alone, which is all an engine's ranks need. A function defined in such a main
cannot be sent to a rank; `check_sendable` says so in one line, before anything is sent.

A notebook's main has no file and no spec: spawn imports nothing of it already.
"""
from __future__ import annotations

import ast
import os
import sys
from contextlib import contextmanager


def _guarded(path: str) -> bool:
    """Does the script at path test `__name__ == "__main__"` somewhere (so importing it runs no work)?"""
    try:
        tree = ast.parse(open(path, "rb").read(), path)
    except (OSError, SyntaxError, ValueError):
        return False
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            names = [n for n in [node.left, *node.comparators] if isinstance(n, ast.Name) and n.id == "__name__"]
            consts = [n for n in [node.left, *node.comparators] if isinstance(n, ast.Constant)
                      and n.value == "__main__"]
            if names and consts:
                return True
    return False


def importable_main() -> bool:
    """Can a spawned child run the parent's main again safely? (a file that exists and is guarded, or no main
    file at all)"""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    path = getattr(spec, "origin", None) if spec is not None else getattr(main, "__file__", None)
    if path is None:
        return True                                      # a notebook, the REPL: spawn imports nothing of it
    return os.path.isfile(path) and _guarded(path)


@contextmanager
def hidden_main(hide: bool):
    """While the ranks start: hide the main module's file and spec from spawn (hide=True), then restore them."""
    main = sys.modules.get("__main__")
    if not hide or main is None:
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    main.__dict__.pop("__file__", None)
    main.__spec__ = None
    try:
        yield
    finally:
        main.__dict__.update(saved)


def check_sendable(fn, main_hidden: bool):
    """A command's function must be importable by the ranks: not from a main they did not import."""
    if main_hidden and getattr(fn, "__module__", None) == "__main__":
        raise ValueError(f"{fn.__name__} is defined in the main module (standard input, `python -c`, or a script "
                         "without an `if __name__ == \"__main__\":` guard), which the ranks do not import: define "
                         "it in a module file and import it, or guard the script")
