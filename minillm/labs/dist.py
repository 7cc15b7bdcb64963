"""`make dist-student`: the student package, a zip that runs outside the repository.

    python -m minillm.labs.dist --wheel build/wheel/minillm-0.1.0-py3-none-any.whl --out dist/minillm-student.zip

The zip holds `notebooks/` (the student editions: exercise solutions stubbed, outputs cleared, and the self-check
answers, each a `<details><summary>Answer</summary> ...</details>` block, removed), the built wheel (the shipped
models, tokenizer and adapters are inside it) and `README.md`, one page for students: install, open, check.
A zip already there is kept unless --force.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import sys
import zipfile

from ..atomic import write_replacing
from .student import read_notebook, student_notebook

ANSWER = re.compile(r"\s*<details><summary>Answer</summary>.*?</details>", re.S)
README = """# minillm: the student workbench

A small Llama inference engine and one notebook per technique real engines use. You build each technique's core
in its notebook and plug it into the engine; a checker tells you whether it works.

## Install (Python 3.10 or newer, about 2 minutes)

    python -m venv minillm-env
    source minillm-env/bin/activate            # Windows: minillm-env\\Scripts\\activate
    pip install torch --index-url https://download.pytorch.org/whl/cpu    # the CPU build (small); any torch >= 2.5
    pip install "{wheel}[student]"
    jupyter lab notebooks

## Work

Open `notebooks/00_tour.ipynb` first and run it top to bottom. In each notebook, the cells marked
`# YOUR CODE HERE` are yours: replace `raise NotImplementedError()` with your code, then run the `check_...`
cell below it. The models the notebooks use ship inside the package: nothing is downloaded.

Check every exercise at once (the score sheet your teacher collects):

    python -m minillm grade notebooks

The self-check questions at the end of each notebook have no answers here: discuss them in class.
"""


def strip_answers(nb: dict) -> dict:
    """The self-check answers (<details> blocks in markdown cells) removed."""
    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            cell["source"] = ANSWER.sub("", "".join(cell["source"])).splitlines(keepends=True)
    return nb


def write_student_zip(out: str, wheel: str, notebooks: str, force: bool = False) -> list[str]:
    """Write the student zip -> the names it holds. ValueError for a missing wheel or notebook folder, or a zip
    already at `out` without force."""
    if os.path.exists(out) and not force:
        raise ValueError(f"{out} exists: pass --force (make dist-student FORCE=1) to overwrite it")
    if not os.path.isfile(wheel) or not wheel.endswith(".whl"):
        raise ValueError(f"--wheel {wheel!r} is not a built wheel (.whl): `pip wheel --no-deps . -w build/wheel`")
    names = sorted(n for n in os.listdir(notebooks) if n.endswith(".ipynb"))
    if not names:
        raise ValueError(f"no .ipynb notebooks in {notebooks}")
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    def write(tmp):
        with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as z:
            for name in names:
                nb = strip_answers(student_notebook(read_notebook(os.path.join(notebooks, name))))
                z.writestr(f"notebooks/{name}", json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
            z.write(wheel, os.path.basename(wheel))
            z.writestr("README.md", README.format(wheel=os.path.basename(wheel)))
    write_replacing(out, write)                                     # a symlink at `out` is replaced, not followed
    return zipfile.ZipFile(out).namelist()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m minillm.labs.dist", description=__doc__.split("\n")[0])
    ap.add_argument("--wheel", required=True, help="the built minillm wheel")
    ap.add_argument("--out", default="dist/minillm-student.zip")
    ap.add_argument("--notebooks", default="notebooks")
    ap.add_argument("--force", action="store_true", help="overwrite a zip already there")
    a = ap.parse_args(argv)
    try:
        names = write_student_zip(a.out, a.wheel, a.notebooks, a.force)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {a.out}: {sum(n.endswith('.ipynb') for n in names)} notebooks, {os.path.basename(a.wheel)}, "
          f"README.md ({os.path.getsize(a.out) / 1e6:.1f} MB)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
