"""`python -m minillm grade DIR` (make grade DIR=student): run every checker on a folder of notebooks.

An exercise is found the way a reader sees it: a cell that calls `check_<name>(<fn>)`, and the nearest
code cell above it that defines `<fn>` (`def`, `class` or `=`). That cell runs alone, in a fresh
namespace (exercise cells import what they use), then the checker runs on what it defined, each under
the checkers' time limit. Kernel puzzles run in numba's CUDA simulator unless --gpu is given. The score
sheet lists every exercise: notebook, checker, warm-up or core, pass or fail and the checker's reason.
Exit status 0 when every exercise passes, 1 otherwise, 2 for a folder with no notebooks.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys

CALL = re.compile(r"\b(check_\w+)\((\w+)\)")


def _defines(source: str, name: str) -> bool:
    return re.search(rf"^(def|class)\s+{name}\b|^{name}\s*=", source, re.M) is not None


def find_exercises(nb: dict) -> list[tuple[str, str, str]]:
    """[(checker name, defined name, defining cell's source)] in notebook order."""
    cells = ["".join(c["source"]) for c in nb["cells"] if c["cell_type"] == "code"]
    found = []
    for i, src in enumerate(cells):
        for m in CALL.finditer(src):
            check, name = m.groups()
            cell = next((cells[j] for j in range(i, -1, -1) if _defines(cells[j], name)), None)
            found.append((check, name, cell))
    return found


def grade_notebook(path: str) -> list[dict]:
    from . import CHECKERS
    from .common import TimeLimit, run_limited
    from .student import read_notebook

    rows = []
    for check, name, cell in find_exercises(read_notebook(path)):
        row = {"notebook": os.path.basename(path), "exercise": check, "function": name}
        run = CHECKERS.get(check)
        row["kind"] = run.kind if run else "?"
        if run is None:
            row.update(passed=False, message=f"no checker named {check} in minillm.labs")
        elif cell is None:
            row.update(passed=False, message=f"no code cell above the check defines {name}")
        else:
            ns = {"__name__": "__exercise__"}
            try:
                run_limited(lambda: exec(compile(cell, f"<{row['notebook']}: {name}>", "exec"), ns))
                result = run(ns.get(name))
                row.update(passed=result.passed, message=result.message)
            except TimeLimit:
                row.update(passed=False, message="the exercise cell itself timed out")
            except BaseException as e:  # noqa: BLE001 - a student's cell can raise anything, SystemExit included
                row.update(passed=False, message=f"the exercise cell raised {type(e).__name__}: {e}")
        rows.append(row)
    return rows


def score_sheet(rows: list[dict]) -> str:
    lines = [f"{'notebook':<34} {'exercise':<30} {'kind':<8} result"]
    for r in rows:
        lines.append(f"{r['notebook']:<34} {r['exercise']:<30} {r['kind']:<8} {'pass' if r['passed'] else 'FAIL'}")
        lines.append(f"{'':<34} {r['message']}")
    for kind in ("core", "warm-up"):
        of = [r for r in rows if r["kind"] == kind]
        lines.append(f"{kind}: {sum(r['passed'] for r in of)}/{len(of)} passed")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm grade", description=__doc__.split("\n")[0])
    ap.add_argument("dir", help="a folder of notebooks, e.g. student/ (make student writes it)")
    ap.add_argument("--gpu", action="store_true", help="run the kernel puzzles on a GPU, not the simulator")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the sheet")
    a = ap.parse_args(argv)
    if not os.path.isdir(a.dir):
        print(f"error: {a.dir} is not a folder (make student writes student/)", file=sys.stderr)
        return 2
    names = sorted(n for n in os.listdir(a.dir) if n.endswith(".ipynb"))
    if not names:
        print(f"error: no .ipynb notebooks in {a.dir}", file=sys.stderr)
        return 2
    from ..kernels import use_simulator
    use_simulator(not a.gpu)          # before anything imports numba.cuda
    rows = [row for name in names for row in grade_notebook(os.path.join(a.dir, name))]
    print(json.dumps(rows, indent=1) if a.json else score_sheet(rows))
    return 0 if all(r["passed"] for r in rows) else 1
