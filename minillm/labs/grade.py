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


def grade_notebook(path: str, isolate: bool = True) -> list[dict]:
    """Every exercise of the notebook at path -> a row each. isolate: each in its own process, fenced
    (minillm.labs.isolate); False: all in this one (faster; a cell could then reach the next exercise)."""
    from . import CHECKERS
    from .common import LIMIT_S
    from .isolate import run_apart
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
        elif isolate:
            row.update(run_apart(grade_exercise, (check, name, cell, row["notebook"]), 2 * LIMIT_S + 60))
        else:
            row.update(grade_exercise(check, name, cell, row["notebook"]))
        rows.append(row)
    return rows


def grade_exercise(check: str, name: str, cell: str, notebook: str, conn=None) -> dict:
    """Run one exercise cell in a fresh namespace, then its checker on what it defined -> {passed, message}
    (sent on conn too, from a child process). Fails a cell that imports what its checker does not allow, or that
    changes minillm's, torch's or numpy's modules (a checker replaced, the engine patched)."""
    from . import CHECKERS
    from .common import TimeLimit, run_limited
    from .isolate import changed, forbidden_imports, snapshot
    run, out = CHECKERS[check], None
    bad = forbidden_imports(cell, run.allow)
    if bad:
        allowed = f" (this exercise may import {', '.join(run.allow)})" if run.allow else ""
        out = {"passed": False, "message": f"the exercise cell imports {', '.join(bad)}: write it yourself, not "
                                           f"the engine's{allowed}"}
    else:
        ns, before = {"__name__": "__exercise__"}, snapshot()
        try:
            run_limited(lambda: exec(compile(cell, f"<{notebook}: {name}>", "exec"), ns))
            patched = changed(before, snapshot())
            result = None if patched else run(ns.get(name))
            patched = patched or changed(before, snapshot(), only="minillm")
            out = {"passed": result.passed, "message": result.message} if not patched else \
                {"passed": False, "message": f"the exercise changed {', '.join(patched[:3])}: an exercise may not "
                                             "replace a checker or patch the engine, torch or numpy"}
        except TimeLimit:
            out = {"passed": False, "message": "the exercise cell itself timed out"}
        except BaseException as e:  # noqa: BLE001 - a student's cell can raise anything, SystemExit included
            out = {"passed": False, "message": f"the exercise cell raised {type(e).__name__}: {e}"}
    if conn is not None:
        conn.send(out)
        conn.close()
    return out


def score_sheet(rows: list[dict]) -> str:
    lines = [f"{'notebook':<34} {'exercise':<30} {'kind':<8} result"]
    for r in rows:
        lines.append(f"{r['notebook']:<34} {r['exercise']:<30} {r['kind']:<8} {'pass' if r['passed'] else 'FAIL'}")
        lines.append(f"{'':<34} {r['message']}")
    for kind in ("core", "warm-up"):
        of = [r for r in rows if r["kind"] == kind]
        lines.append(f"{kind}: {sum(r['passed'] for r in of)}/{len(of)} passed")
    return "\n".join(lines)


def csv_sheet(folders: dict) -> str:
    """{folder: rows} -> CSV, one row per folder (a student), one column per exercise ("notebook:checker"), cells
    pass / fail, then the core and warm-up totals: the shape a learning-management system imports."""
    import csv
    import io
    columns = list(dict.fromkeys(f"{r['notebook']}:{r['exercise']}" for rows in folders.values() for r in rows))
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    w.writerow(["folder", *columns, "core_passed", "warmup_passed"])
    for folder, rows in folders.items():
        got = {f"{r['notebook']}:{r['exercise']}": "pass" if r["passed"] else "fail" for r in rows}
        w.writerow([folder, *(got.get(c, "missing") for c in columns),
                    sum(r["passed"] for r in rows if r["kind"] == "core"),
                    sum(r["passed"] for r in rows if r["kind"] == "warm-up")])
    return out.getvalue()


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm grade", description=__doc__.split("\n")[0])
    ap.add_argument("dirs", nargs="+", metavar="dir",
                    help="a folder of notebooks, e.g. student/ (make student writes it); several: one per student")
    ap.add_argument("--gpu", action="store_true", help="run the kernel puzzles on a GPU, not the simulator")
    ap.add_argument("--json", action="store_true", help="print the rows as JSON instead of the sheet")
    ap.add_argument("--csv", action="store_true", help="one CSV row per folder, one column per exercise")
    ap.add_argument("--in-process", action="store_true",
                    help="every exercise in this process (faster; a cell could then reach the next exercise)")
    a = ap.parse_args(argv)
    names = {}
    for d in a.dirs:
        if not os.path.isdir(d):
            print(f"error: {d} is not a folder (make student writes student/)", file=sys.stderr)
            return 2
        names[d] = sorted(n for n in os.listdir(d) if n.endswith(".ipynb"))
        if not names[d]:
            print(f"error: no .ipynb notebooks in {d}", file=sys.stderr)
            return 2
    from ..kernels import use_simulator
    use_simulator(not a.gpu)          # before anything imports numba.cuda
    folders = {d: [row for name in names[d] for row in grade_notebook(os.path.join(d, name), not a.in_process)]
               for d in a.dirs}
    if a.csv:
        print(csv_sheet(folders), end="")
    elif a.json:
        print(json.dumps(folders[a.dirs[0]] if len(a.dirs) == 1 else folders, indent=1))
    else:
        print("\n\n".join((f"{d}\n" if len(a.dirs) > 1 else "") + score_sheet(rows) for d, rows in folders.items()))
    return 0 if all(r["passed"] for rows in folders.values() for r in rows) else 1
