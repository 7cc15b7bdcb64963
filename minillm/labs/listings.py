"""Listings that would give an answer away: the student edition shows them after the exercise, not before.

A notebook's "Read the engine's code" cells print the engine's own source (minillm.viz.show_source). Where a
listing holds the mechanism a core exercise asks for (the tiled matmul of puzzle 6, the verification rule, the
router's top-k ...), a student who reads down the notebook meets the answer before the question. So `make student`
moves such a listing, with the markdown that introduces it, to just after the exercise's checker, and leaves a line
saying where it went. What a listing shows is read from the teacher's notebook's stored output (the notebooks are
kept executed), before the student edition clears the outputs. A listing gives an answer away when it shows at least
ANSWER_LINES of the solution's code lines (at least 12 characters, comments and `self.` aside), or their
expressions.
"""
from __future__ import annotations

import re

ANSWER_LINES = 2
CALL = re.compile(r"\b(check_\w+)\((\w+)\)")
MOVED = ("*The engine's listing that was here, and its introduction, come after the exercise below: they show "
         "its answer.*")


def listing_lines(cell: dict) -> list[str]:
    """The source lines a show_source cell's stored outputs display (the teacher's notebooks are executed, their
    listings kept: "46  def residual(...)" after a "path:first-last  title (n lines)" header)."""
    out = []
    for o in cell.get("outputs", []):
        text = "".join(o.get("data", {}).get("text/plain", "")) or "".join(o.get("text", ""))
        out += [m.group(1) for m in re.finditer(r"^\s*\d+  (.*)$", text, re.M)]
    return out


def solution_lines(cell: str) -> set[str]:
    """The code lines between ### BEGIN SOLUTION and ### END SOLUTION worth matching (stripped, >= 12 chars)."""
    out, inside = set(), False
    for line in cell.splitlines():
        if "### BEGIN SOLUTION" in line or "### END SOLUTION" in line:
            inside = "BEGIN" in line
            continue
        code = line.split("#")[0].strip()
        if inside and len(code) >= 12:
            out.add(code)
    return out


def _norm(line: str) -> str:
    """A code line as compared: no spaces, no `self.` / `self.cfg.` prefixes (a method's field is a free name
    in an exercise's function)."""
    return re.sub(r"\bself\.(cfg\.|config\.)?", "", line).replace(" ", "")


def shown(solution: set, listing: list) -> int:
    """How many solution lines a listing shows: the line itself, or its expression (after `=` or `return`),
    inside one of the listing's lines."""
    text = [_norm(line) for line in listing]
    count = 0
    for line in solution:
        expr = re.split(r"^return |^[\w\[\], .]+? = ", line, maxsplit=1)[-1]
        parts = {expr, expr.split(", ", 1)[-1]}                          # a returned tuple's last parts too
        keys = {_norm(line)} | {_norm(e) for e in parts if len(e) >= 12}
        count += any(k in t for k in keys for t in text)
    return count


def giveaways(nb: dict, core: set) -> list[tuple[int, int]]:
    """[(listing cell index, the index of the core checker's cell it must follow)]: each show_source cell above a
    core exercise's checker that shows ANSWER_LINES or more of that exercise's solution lines."""
    cells = nb["cells"]
    code = {i: "".join(c["source"]) for i, c in enumerate(cells) if c["cell_type"] == "code"}
    listings = {i: listing_lines(cells[i]) for i, src in code.items() if "show_source(" in src}
    moves = []
    for i, src in code.items():
        for check, name in CALL.findall(src):
            if check not in core:
                continue
            solution = next((solution_lines(code[j]) for j in sorted(code, reverse=True)
                             if j <= i and re.search(rf"^(def|class)\s+{name}\b", code[j], re.M)), set())
            moves += [(j, i) for j, lines in listings.items()
                      if j < i and shown(solution, lines) >= ANSWER_LINES and j not in [m for m, _ in moves]]
    return moves


def move_giveaways(nb: dict, core: set) -> dict:
    """The notebook with each giveaway listing (and the markdown cell right above it) moved after its checker."""
    cells, moves = list(nb["cells"]), dict(giveaways(nb, core))
    if not moves:
        return nb
    keep, after = [], {}
    for j, c in enumerate(cells):
        if j in moves:
            intro = [keep.pop()] if keep and keep[-1][1]["cell_type"] == "markdown" and j - 1 == keep[-1][0] else []
            after.setdefault(moves[j], []).extend([x for _, x in intro] + [c])
            keep.append((j, {"cell_type": "markdown", "metadata": {}, "source": [MOVED]}))
        else:
            keep.append((j, c))
    out = []
    for j, c in keep:
        out.append(c)
        out += after.get(j, [])
    return {**nb, "cells": out}
