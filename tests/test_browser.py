"""The browser check catches what it exists to catch (`make test-browser` runs this before the notebooks): in
JupyterLab in headless Chromium, a notebook with a traceback, one whose widget prints as its repr, and one whose
explorer ignores its slider each fail, naming the cell; a notebook whose explorer redraws passes.
About 45 s (one JupyterLab, four notebooks). Needs playwright and chromium: the target installs both."""
import json
import shutil

import pytest

pytestmark = pytest.mark.browser


def _notebook(*sources: str) -> dict:
    cells = [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [], "source": s}
             for s in sources]
    return {"cells": cells, "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3",
                                                         "language": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


_PLOT = ("import ipywidgets as w\nimport matplotlib.pyplot as plt\n%matplotlib inline\n"
         "def f(a=1):\n    plt.figure(figsize=(3, 2)); plt.plot([0, 1], [0, {}]); plt.show()\n"
         "w.interact(f, a=(1, 10))")
PLANTED = {
    "01_error.ipynb": (_notebook("x = 1", "1 / 0", "print('after')"), "cell 1: error output"),
    "02_repr.ipynb": (_notebook("import ipywidgets as w\nprint(repr(w.VBox([w.IntSlider()])))"),
                      'cell 0: widget shown as "VBox(children='),
    "03_stale.ipynb": (_notebook(_PLOT.format("1")), "cell 0: its figure did not change"),
    "04_good.ipynb": (_notebook("x = 2", _PLOT.format("a")), None),
}


def test_the_browser_check_fails_each_planted_fault_by_its_cell_and_passes_a_good_explorer(tmp_path):
    from browser_notebooks import check
    chromium = shutil.which("chromium")
    assert chromium, "make test-browser installs Debian's chromium (apt-get install chromium)"
    for name, (nb, _) in PLANTED.items():
        (tmp_path / name).write_text(json.dumps(nb))
    out = tmp_path / "out"
    results = check(sorted(PLANTED), str(out), chromium, str(tmp_path), settle_s=15)   # a good one redraws in <2 s
    for name, (_, fault) in PLANTED.items():
        found = results[name]["problems"]
        if fault is None:
            assert results[name]["ok"], (name, found)
        else:
            assert not results[name]["ok"] and any(p.startswith(fault) for p in found), (name, found)
        assert (out / name.replace(".ipynb", ".png")).stat().st_size > 1000     # a screenshot per notebook
    assert json.loads((out / "results.json").read_text()).keys() == PLANTED.keys()
