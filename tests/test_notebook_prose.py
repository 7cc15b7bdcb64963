"""The notebooks read as a course and say only what their cells measured (DESIGN.md, "Notebooks").

These catch the classes of error an instructor's review found: numbers typed by hand into markdown (they
go stale, or contradict the output beside them), links to files that are not in the repository, a map
that says shipped notebooks do not exist, timing comparisons asserted in lesson cells (they fail on a busy
laptop), terms used before they are defined, and a notebook without objectives, the engine map, takeaways
or self-check questions.
"""
import glob
import json
import os
import re

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
NOTEBOOKS = sorted(glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb")))
NAMES = [os.path.basename(p)[:2] for p in NOTEBOOKS]


def cells(path):
    return json.load(open(path, encoding="utf-8"))["cells"]


def text(cell) -> str:
    return "".join(cell["source"])


def markdown(path) -> list[str]:
    return [text(c) for c in cells(path) if c["cell_type"] == "markdown"]


# A number with a unit of measure (x, %, time, bytes, rate). In a markdown cell outside `code` and $math$ it
# was typed by hand: it must be a constant (a format's size, a paper's reported result), listed below with
# its notebook. Anything measured on the reader's machine is rendered from a variable (Markdown(f"...")).
MEASURE = re.compile(r"(?<![\w.])\d+(?:\.\d+)?(?:\s?(?:-|to)\s?\d+(?:\.\d+)?)?"
                     r"(?:x\b|×|\s?(?:%|ms\b|µs\b|us\b|tok/s|[KMG]iB|[MG]B\b|GFLOP/s|seconds?\b|s\b))")
CONSTANTS = {   # notebook: phrases with hand-typed numbers that are constants or cited results, not measurements
    "02": ["60 to 80 %", "under 4 %", "128 KiB per token", "1 GiB for an 8192", "512 KiB"],
    "03": ["full 16x", "14 GB of weights", "a 64 MiB copy"],
    "04": ["= 8 GiB", "14 GB", "= 256 GiB", "2-4x in the paper", "up-to-8x decode"],
    "06": ["80% of every"],
    "07": ["4x or 8x", "60x larger"],
    "08": ["Reaching 2x", "2-3x, as the papers"],
    "09": ["10% of the peak"],
    "12": ["4 MiB of the 28", "**16 KiB**", "1 KiB of activations", "16 KiB logit row", "~450 GB/s", "~25 GB/s",
           "30% of the prompt", "= 128 KiB", "50 us + 2 GB/s", "90% of what", "under 10%"],
    "16": ["5x the median", "0.9x the capacity", "(within 2%)", "about 4x as many"],   # the task's constants
}


def strip_code(md: str) -> str:
    md = re.sub(r"```.*?```", " ", md, flags=re.S)
    md = re.sub(r"`[^`]*`", " ", md)
    return re.sub(r"\$[^$]*\$", " ", md)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_markdown_types_no_measured_numbers(path):
    nb, found = os.path.basename(path)[:2], []
    for md in markdown(path):
        plain = strip_code(md)
        for phrase in CONSTANTS.get(nb, []):
            plain = plain.replace(phrase, " ")
        found += [plain[max(0, m.start() - 30):m.end() + 10].replace("\n", " ") for m in MEASURE.finditer(plain)]
    assert not found, (f"{nb}: numbers typed into markdown (render measured ones from a variable with "
                       f"Markdown(f'...'); list true constants in CONSTANTS): {found}")


def test_the_lint_catches_a_typed_measurement():
    for typed in ["about 4 MiB of weights", "1.37x greedy", "1.3-1.5x at batch 1", "About 15 seconds",
                  "waste is 6.0% averaged", "TTFT 35 ms", "150 tok/s"]:
        assert MEASURE.search(strip_code(typed)), typed
    for fine in ["`2 x n_layers`", "2 x 32 layers x 8", "4 bits", "16-token blocks", "$p(x) / q(x)$", "notebook 05"]:
        assert not MEASURE.search(strip_code(fine)), fine


OTHER_PROJECTS = {"vllm", "sglang", "llama.cpp", "tensorrt_llm"}     # paths in their repositories, not ours
EXAMPLE_NAMES = {"model.bin", "script.py", "my_policy.py", "score.json"}   # "a file you have", in instructions
FILE_REF = re.compile(r"(?<![\w/.-])((?:[\w-]+/)*[\w-]+\.(?:md|py|ipynb|bin|json|txt|cfg))\b")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_files_named_in_prose_exist(path):
    """A file a notebook points the reader to is in the repository (02 once cited a DESIGN.md that is not)."""
    missing = []
    for md in markdown(path):
        for ref in FILE_REF.findall(md):
            if ref.split("/")[0] in OTHER_PROJECTS or ref in EXAMPLE_NAMES:
                continue
            if not any(glob.glob(os.path.join(ROOT, "**", ref), recursive=True)):
                missing.append(ref)
    assert not missing, f"{os.path.basename(path)} names files that are not in the repository: {missing}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_no_shipped_notebook_is_called_missing(path):
    for md in markdown(path):
        for m in re.finditer(r"(?i)(not (?:built|written|there) yet|does not exist yet|do not exist yet|coming soon|"
                             r"to be written)", md):
            context = md[max(0, m.start() - 80):m.end()]
            for nb in re.findall(r"\b(\d\d)\b", context):
                assert nb not in NAMES, f"{os.path.basename(path)} says notebook {nb} is missing: {context!r}"


TIMING = re.compile(r"ttft|tpot|throughput|tok_s|seconds|elapsed|speed|latency|_time\b|time_|\btimes?\b|"
                    r"perf_counter|_ms\b|_us\b|faster|slower", re.I)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_lesson_cells_assert_no_timing(path):
    """Timing comparisons belong in tests and benchmarks: on a busy laptop they fail a lesson for nothing."""
    bad = [line.strip() for c in cells(path) if c["cell_type"] == "code"
           for line in text(c).splitlines() if line.strip().startswith("assert") and TIMING.search(line)
           and "# order, not speed" not in line]       # e.g. clock readings in the order events happened
    assert not bad, f"{os.path.basename(path)} asserts timings in lesson cells: {bad}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=NAMES)
def test_opens_with_objectives_and_the_engine_map_and_ends_with_takeaways(path):
    nb, cs = os.path.basename(path)[:2], cells(path)
    head = "\n".join(text(c) for c in cs[:4])
    assert re.search(r"(?m)^#+ Objectives|\*\*Objectives", head), f"{nb}: no objectives in its first cells"
    assert re.search(r"(?i)prerequisites", head), f"{nb}: no prerequisites in its first cells"
    assert f'draw_engine_map("{nb}")' in head, f"{nb}: its first cells do not draw the engine map for {nb}"
    tail = [text(c) for c in cs[-6:] if c["cell_type"] == "markdown"]
    takeaways = [t for t in tail if re.search(r"(?m)^#+ Takeaways", t)]
    assert takeaways, f"{nb}: no '## Takeaways' near the end"
    checks = [t for t in tail if re.search(r"(?m)^#+ Self-check", t)]
    assert checks, f"{nb}: no '## Self-check' questions near the end"
    questions = re.findall(r"(?m)^\d+\. ", checks[0])
    assert 3 <= len(questions) <= 5, f"{nb}: {len(questions)} self-check questions (want 3-5, numbered)"


# term: (how it is written, the notebook that defines it). Its first use in reading order must be in that
# notebook, in bold (**term**: where the text defines it), or after its bold definition there.
TERMS = {
    "warp": (r"\bwarps?\b", "03"),
    "p99": (r"\bp99\b", "05"),
    "Poisson": (r"\bPoisson\b", "05"),
    "perplexity": (r"\bperplexit(?:y|ies)\b", "07"),
    "TPOT": (r"\bTPOT\b", "05"),
    "roofline": (r"\broofline\b", "03"),
    "arithmetic intensity": (r"\barithmetic intensity\b", "03"),
    "coalescing": (r"\bcoalesc", "03"),
    "online softmax": (r"\bonline softmax\b", "04"),
    "copy-on-write": (r"\bcopy-on-write\b", "06"),
}


@pytest.mark.parametrize("term", TERMS)
def test_terms_are_defined_where_first_used(term):
    pattern, home = TERMS[term]
    for path in NOTEBOOKS:
        nb = os.path.basename(path)[:2]
        for md in markdown(path):
            m = re.search(pattern, md, re.I)
            if not m:
                continue
            assert nb == home, f"{term!r} is first used in notebook {nb}, but defined in {home}: {md[:120]!r}"
            bold = re.search(r"\*\*[^*]*(?:" + pattern + r")[^*]*\*\*", md, re.I)
            assert bold and bold.start() <= m.start() + 2, \
                f"{nb}: the first use of {term!r} is not its definition (write it as **{term}** there)"
            return
    pytest.fail(f"{term!r} is never used in a notebook's prose")
