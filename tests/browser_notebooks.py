"""Every notebook run through JupyterLab's own UI in headless Chromium (`make test-browser`, run by .ci/run).

    python tests/browser_notebooks.py [--out results/browser] [--only 00,05] [--chromium /usr/bin/chromium]

starts JupyterLab on a copy of notebooks/ (so nothing is saved into the repository), opens each notebook, clicks
Run > Run All Cells, waits until every cell has run, and fails the notebook on:
  - an error output (a traceback), naming the cell;
  - a widget that renders as its raw repr (`interactive(children=...`, `VBox(...`) or as "Error displaying widget";
  - an explorer whose figure stays the same after one of its controls moves (each widget area: one slider nudged or
    one dropdown changed, then its image compared byte for byte).
A screenshot of each notebook goes under --out; results.json there lists each notebook's verdict and seconds.
playwright comes from PyPI and drives Debian's chromium (`apt-get install chromium`): `playwright install` (a
download from a CDN) is never needed.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RAW_REPR = ("interactive(children=", "VBox(children=", "HBox(children=", "Error displaying widget",
            "Output(outputs=")
CELL_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_lab(folder: str, port: int) -> subprocess.Popen:
    args = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ServerApp.token=",
            "--ServerApp.password=", "--ServerApp.disable_check_xsrf=True", f"--notebook-dir={folder}",
            "--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    if os.geteuid() == 0:
        args.append("--allow-root")
    env = {**os.environ, "MINILLM_PROGRESS": "0"}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    for _ in range(120):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc
        except OSError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"JupyterLab did not start on port {port}")


def wait_for_kernel(page, timeout_s: float = 120):
    """Until the status bar says the kernel is idle. A notebook without kernel metadata first asks which kernel
    to start: take the default (Python 3)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dialog = page.locator(".jp-Dialog .jp-mod-accept")
        if dialog.count():
            dialog.first.click()
        status = page.evaluate("() => [...document.querySelectorAll('.jp-StatusBar-TextItem')]"
                               ".map(e => e.textContent).join(' ')")
        if "| Idle" in status and "No Kernel" not in status:
            return
        page.wait_for_timeout(500)
    raise TimeoutError(f"the kernel was not idle after {timeout_s:.0f} s")


def run_all(page, timeout_s: float):
    """Run > Run All Cells, then wait until no cell is queued or running and the kernel is idle."""
    page.locator(".lm-MenuBar-itemLabel", has_text="Run").first.click()
    page.locator(".lm-Menu-itemLabel", has_text="Run All Cells").first.click()
    deadline = time.monotonic() + timeout_s
    page.wait_for_timeout(1000)
    while time.monotonic() < deadline:
        busy = page.evaluate("""() => [...document.querySelectorAll('.jp-Notebook .jp-InputPrompt')]
                                        .filter(p => p.textContent.includes('*')).length""")
        if busy == 0:
            return
        page.wait_for_timeout(500)
    raise TimeoutError(f"cells still running after {timeout_s:.0f} s")


def problems(page) -> list[str]:
    """Error outputs and broken widgets, each naming its cell (its position among the notebook's cells)."""
    return page.evaluate("""(raw) => {
        const out = [];
        document.querySelectorAll('.jp-Notebook .jp-Cell').forEach((cell, i) => {
            cell.querySelectorAll('.jp-OutputArea-output').forEach(o => {
                const mime = o.getAttribute('data-mime-type') || '';
                const text = o.textContent || '';
                if (o.classList.contains('jp-mod-error') ||
                    (mime === 'application/vnd.jupyter.stderr' && /Traceback|Error:/.test(text)
                     && /^\\s*[A-Z]\\w*Error/m.test(text)))
                    out.push(`cell ${i}: error output: ${text.slice(0, 200)}`);
                for (const r of raw) if (text.includes(r)) out.push(`cell ${i}: widget shown as "${r}..."`);
            });
        });
        return out;
    }""", list(RAW_REPR))


def widgets_respond(page, settle_s: float = 60) -> tuple[list[str], int]:
    """In each cell with widget controls: nudge one slider (or change one dropdown), and check that the cell's
    image changed. -> (the cells whose figure stayed the same, how many cells' controls were moved)"""
    stale, moved = [], 0
    cells = page.locator(".jp-Notebook .jp-Cell")
    for i in range(cells.count()):
        cell = cells.nth(i)
        slider = cell.locator(".widget-slider .noUi-handle, .widget-hslider .noUi-handle")
        select = cell.locator(".widget-dropdown select")
        if not slider.count() and not select.count():
            continue
        moved += 1
        image = cell.locator(".jp-OutputArea-output img, .jp-OutputArea-output svg").last
        before = image.screenshot() if image.count() else cell.screenshot()
        if slider.count():
            slider.first.focus()
            for _ in range(3):
                slider.first.press("ArrowRight")
        else:
            options = select.first.locator("option")
            values = [options.nth(k).get_attribute("value") for k in range(options.count())]
            current = select.first.input_value()
            select.first.select_option(next(v for v in values if v != current))
        deadline = time.monotonic() + settle_s                  # the explorer reruns its engine, then redraws
        after = before
        while time.monotonic() < deadline and after == before:
            page.wait_for_timeout(1000)
            image = cell.locator(".jp-OutputArea-output img, .jp-OutputArea-output svg").last
            after = image.screenshot() if image.count() else cell.screenshot()
        if after == before:
            stale.append(f"cell {i}: its figure did not change after a control moved")
    return stale, moved


def check(names: list, out: str, chromium: str, folder: str = os.path.join(ROOT, "notebooks"),
          settle_s: float = 60) -> dict:
    from playwright.sync_api import sync_playwright
    os.makedirs(out, exist_ok=True)
    work = tempfile.mkdtemp(prefix="minillm-browser-")
    for n in names:
        shutil.copy(os.path.join(folder, n), work)
    port = free_port()
    lab = start_lab(work, port)
    results = {}
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            for n in names:
                t0 = time.monotonic()
                page = browser.new_page(viewport={"width": 1400, "height": 1000})
                try:
                    # its own workspace, reset: only this notebook is open, so Run All runs it
                    page.goto(f"http://127.0.0.1:{port}/lab/workspaces/nb{len(results)}/tree/{n}?reset",
                              timeout=120_000)
                    page.wait_for_selector(".jp-Notebook .jp-Cell", timeout=120_000)
                    wait_for_kernel(page)
                    run_all(page, CELL_TIMEOUT_S * 3)
                    found, moved = problems(page), 0
                    if not found:
                        stale, moved = widgets_respond(page, settle_s)
                        found += stale
                except Exception as e:                               # a hang or a UI that never came up
                    found, moved = [f"{type(e).__name__}: {str(e)[:300]}"], 0
                page.screenshot(path=os.path.join(out, n.replace(".ipynb", ".png")), full_page=True)
                results[n] = {"ok": not found, "problems": found, "widgets_moved": moved,
                              "seconds": round(time.monotonic() - t0, 1)}
                print(f"{n}: {'ok' if not found else 'FAIL'} ({results[n]['seconds']} s, {moved} widgets moved)"
                      + "".join(f"\n    {f}" for f in found), flush=True)
                page.close()
            browser.close()
    finally:
        lab.terminate()
        lab.wait(timeout=30)
        shutil.rmtree(work, ignore_errors=True)
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    return results


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python tests/browser_notebooks.py")
    ap.add_argument("--out", default=os.path.join(ROOT, "results", "browser"))
    ap.add_argument("--only", default=None, help="notebook numbers, e.g. 00,05")
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    ap.add_argument("--dir", default=os.path.join(ROOT, "notebooks"), help="the notebooks' folder")
    a = ap.parse_args(argv)
    names = sorted(n for n in os.listdir(a.dir) if n.endswith(".ipynb"))
    if a.only:
        names = [n for n in names if n[:2] in a.only.split(",")]
    results = check(names, a.out, a.chromium, a.dir)
    bad = [n for n, r in results.items() if not r["ok"]]
    print(f"{len(results) - len(bad)} of {len(results)} notebooks clean in JupyterLab"
          + (f"; failed: {', '.join(bad)}" if bad else ""))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
