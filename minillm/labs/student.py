"""`python -m minillm student SRC DST` (make student): notebooks with the exercise solutions removed.

In every code cell, the lines from `### BEGIN SOLUTION` to `### END SOLUTION` become a stub at the
same indentation, and all outputs are cleared, so the student edition shows no answers anywhere; an engine
listing that would show a core exercise's answer comes after that exercise (minillm.labs.listings).
"""
from __future__ import annotations

import json
import os
import re
import sys

from ..atomic import write_text_replacing

STUB = "# YOUR CODE HERE\nraise NotImplementedError()"
_BLOCK = re.compile(r"^([ \t]*)### BEGIN SOLUTION[^\n]*\n.*?^[ \t]*### END SOLUTION[^\n]*(\n|$)", re.S | re.M)


def strip_solutions(source: str) -> str:
    def stub(m):
        indent = m.group(1)
        return "\n".join(indent + line for line in STUB.split("\n")) + m.group(2)
    out = _BLOCK.sub(stub, source)
    if "### BEGIN SOLUTION" in out or "### END SOLUTION" in out:
        raise ValueError("unbalanced ### BEGIN SOLUTION / ### END SOLUTION markers in:\n" + source)
    return out


def student_notebook(nb: dict) -> dict:
    """The student edition: listings that show a core exercise's answer moved after its checker (read from the
    stored outputs: minillm.labs.listings), solutions stubbed, outputs cleared."""
    from . import CHECKERS
    from .listings import move_giveaways
    nb = move_giveaways(json.loads(json.dumps(nb)), {k for k, run in CHECKERS.items() if run.kind == "core"})
    for cell in nb["cells"]:
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        cell["source"] = strip_solutions(src).splitlines(keepends=True)
        cell["outputs"], cell["execution_count"] = [], None
    return nb


def read_notebook(path: str) -> dict:
    """The notebook's JSON, or a ValueError naming the file (not a KeyError from deep in student_notebook)."""
    try:
        with open(path, encoding="utf-8") as f:
            nb = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: not a notebook (invalid JSON: {e})") from None
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise ValueError(f"{path}: not a notebook (no list of cells in it)")
    return nb


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m minillm student SRC_DIR DST_DIR", file=sys.stderr)
        return 1
    src, dst = argv
    if os.path.realpath(dst) == os.path.realpath(src):  # same folder, a "." or a link: the solutions would be lost
        print(f"error: DST {dst} is the source folder {src}; the student edition would overwrite the notebooks "
              f"with their solutions stripped: choose another DST", file=sys.stderr)
        return 2
    names = sorted(n for n in os.listdir(src) if n.endswith(".ipynb"))  # a missing SRC fails before DST is made
    os.makedirs(dst, exist_ok=True)
    for name in names:
        nb = read_notebook(os.path.join(src, name))
        write_text_replacing(os.path.join(dst, name), json.dumps(student_notebook(nb), indent=1, ensure_ascii=False)
                             + "\n")                         # a symlink at the target is replaced, not followed
    print(f"wrote {len(names)} student notebooks to {dst}")
    return 0
