"""notebooks/README.md, the course map: every notebook in it (and nothing that is not there), every local
link resolves, the glossary defines the terms the notebooks rely on."""
import glob
import os
import re

NB_DIR = os.path.join(os.path.dirname(__file__), "..", "notebooks")
README = open(os.path.join(NB_DIR, "README.md"), encoding="utf-8").read()


def test_the_map_lists_every_notebook_once_with_its_time():
    names = sorted(os.path.basename(p)[:-len(".ipynb")] for p in glob.glob(os.path.join(NB_DIR, "*.ipynb")))
    rows = re.findall(r"^\| \[(\w+)\]\((\w+)\.ipynb\) \|.*\| (\d+) s \|$", README, re.M)
    assert [r[0] for r in rows] == names
    assert all(name == target for name, target, _ in rows)


def test_local_links_resolve_and_web_links_are_https():
    for target in re.findall(r"\]\(([^)]+)\)", README):
        if target.startswith("http"):
            assert target.startswith("https://"), target
        else:
            assert os.path.exists(os.path.join(NB_DIR, target)), target


def test_the_glossary_defines_the_course_terms():
    glossary = README.split("## Glossary", 1)[1].split("\n## ", 1)[0]
    terms = [row.split("|")[1].strip() for row in glossary.splitlines() if row.startswith("| ") and "---" not in row]
    for term in ["prefill", "decode", "TTFT", "TPOT", "goodput", "p50 / p99", "HBM", "SM", "warp", "coalescing",
                 "occupancy", "bank conflict", "roofline", "arithmetic intensity", "GQA / MQA / MHA", "MLA", "slot",
                 "block, block table", "copy-on-write (CoW)", "perplexity", "alpha (acceptance rate)"]:
        assert term in terms, f"glossary has no row for {term!r}"
