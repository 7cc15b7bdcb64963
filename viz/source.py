"""show_source: the engine's own lines, highlighted, with their file and line numbers.

A notebook's "read the engine's code" cell calls it on the function, method or class that implements
the technique, so the reader sees the code that just ran, not a copy that could drift from it.
"""
from __future__ import annotations

import html
import inspect
import os

MAX_LINES = 60


class SourceListing:
    """Lines `first`..`last` of `path` (1-based, inclusive). In Jupyter: a highlighted listing; as text:
    numbered lines under a `path:first-last` header."""

    def __init__(self, title: str, path: str, first: int, lines: list[str], cut: int = 0):
        self.title, self.path, self.first, self.lines, self.cut = title, path, first, lines, cut
        self.last = first + len(lines) - 1

    @property
    def header(self) -> str:
        more = f", {self.cut} more lines not shown" if self.cut else ""
        return f"{self.path}:{self.first}-{self.last}  {self.title} ({len(self.lines)} lines{more})"

    def __repr__(self):
        width = len(str(self.last))
        body = "\n".join(f"{self.first + i:>{width}}  {line}" for i, line in enumerate(self.lines))
        return f"{self.header}\n{body}"

    def _repr_html_(self):
        code = "\n".join(self.lines)
        try:
            from pygments import highlight
            from pygments.formatters import HtmlFormatter
            from pygments.lexers import PythonLexer
            fmt = HtmlFormatter(linenos="inline", linenostart=self.first, noclasses=True, style="friendly")
            body = highlight(code, PythonLexer(), fmt)
        except ImportError:       # pygments comes with IPython; plain text without it
            body = f"<pre>{html.escape(repr(self))}</pre>"
        return f"<div><b><code>{html.escape(self.header)}</code></b>{body}</div>"


def _display_path(path: str) -> str:
    """The file relative to the project root (the folder holding minillm/), so no machine path shows."""
    import importlib.util
    root = os.path.dirname(os.path.dirname(os.path.abspath(importlib.util.find_spec("minillm").origin)))
    rel = os.path.relpath(os.path.abspath(path), root)
    return os.path.basename(path) if rel.startswith("..") else rel


def show_source(obj, start: str | None = None, end: str | None = None, max_lines: int = MAX_LINES) -> SourceListing:
    """The source of obj (a function, method, class or module). `start` and `end` cut it to the lines from
    the first one containing `start` to the first one after it containing `end`, both included; longer
    listings stop after max_lines (the header says how many were left out)."""
    target = inspect.unwrap(getattr(obj, "py_func", obj))       # a numba kernel shows its Python body
    lines, first = inspect.getsourcelines(target)
    first = max(first, 1)
    lines = [line.rstrip("\n") for line in lines]
    if start is not None:
        at = next((i for i, line in enumerate(lines) if start in line), None)
        if at is None:
            raise ValueError(f"start={start!r} is not in the source of {getattr(target, '__qualname__', target)}")
        lines, first = lines[at:], first + at
    if end is not None:
        at = next((i for i, line in enumerate(lines) if end in line), None)
        if at is None:
            raise ValueError(f"end={end!r} is not in the source of {getattr(target, '__qualname__', target)} "
                             f"after start={start!r}")
        lines = lines[:at + 1]
    cut = max(0, len(lines) - max_lines)
    title = getattr(target, "__qualname__", getattr(target, "__name__", ""))
    return SourceListing(title, _display_path(inspect.getsourcefile(target)), first, lines[:max_lines], cut)
