"""The package's layers (README's map): imports point down only, and no files import each other in a circle.

    kernels, config, paths, atomic, progress, the ground: numba kernels, plain configuration, thread counts,
    threads                                   writes that replace a file whole
    llama, lora, moe                          the model and its numerics; LoRA adapters and experts, which plug
                                              into its linears and FFNs (llama never imports them)
    formats, guided                           files in and out; structured output's automata over the tokenizer
    core                                      the minimal engine's mechanisms and its seams
    spec_decode, quantization, backends,      plug into the core's seams; independent of each other
    parallel, decoding, scheduling, kv_eviction
    engine, workload                          parts prepared in one place, LLMEngine, LLM; serving workloads,
                                              their clocks and metrics (plain data: shared by the tools above)
    training, serve                           tools that use the engine
    cluster                                   several engines (it runs serve's server for its HTTP router)
    bench                                     measures all of the above (the cluster and training included)
    labs                                      the notebooks' checkers (they grade with the bench's measures)
    viz                                       draws what the layers below record, from data or a callable it is
                                              handed: it never imports a tool (minillm never imports it)
    __main__, __init__                        the CLI and the package's face

No folder imports another of its own layer (no sideways arrows: two tools share code through a lower layer).
Every import is read from the source with `ast`, function-level imports included: a lazy import is still an arrow.
"""
import ast
import os

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
LAYERS = {"kernels": 0, "config": 0, "paths": 0, "atomic": 0, "progress": 0, "threads": 0, "_moved": 0, "_checkout": 0,
          "llama": 1, "lora": 1, "moe": 1, "formats": 2, "guided": 2,
          "core": 3,
          "spec_decode": 4, "quantization": 4, "backends": 4, "parallel": 4, "decoding": 4, "scheduling": 4,
          "kv_eviction": 4, "engine": 5, "workload": 5,
          "training": 6, "serve": 6, "cluster": 7, "bench": 8, "labs": 9,
          "viz": 10, "__main__": 11, "__init__": 11}
TOOLS = {"training", "serve", "cluster", "bench", "labs"}    # viz draws what they give it; it imports none of them


def modules() -> dict:
    """module name -> (file path, is a package)"""
    found = {}
    for folder, pkg in (("minillm", "minillm"), ("kernels", "minillm.kernels"), ("viz", "minillm.viz")):
        base = os.path.join(ROOT, folder)
        for dirpath, dirs, files in os.walk(base):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for f in files:
                if f.endswith(".py"):
                    rel = os.path.relpath(os.path.join(dirpath, f), base)[:-3].split(os.sep)
                    is_pkg = rel[-1] == "__init__"
                    name = ".".join([pkg] + (rel[:-1] if is_pkg else rel))
                    found[name] = (os.path.join(dirpath, f), is_pkg)
    return found


def imports(name: str, path: str, is_pkg: bool, known: dict) -> set:
    tree = ast.parse(open(path).read())
    out = set()
    package = name if is_pkg else name.rsplit(".", 1)[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:                          # `from . import x` may name a module
                if f"{target}.{alias.name}" in known:
                    out.add(f"{target}.{alias.name}")
            out.add(target)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {t for t in out if t in known and t != name}


def layer_of(name: str) -> tuple[str, int]:
    parts = name.split(".")
    key = "__init__" if name == "minillm" else parts[1]
    return key, LAYERS[key]


@pytest.fixture(scope="module")
def graph():
    known = modules()
    return {m: imports(m, p, pkg, known) for m, (p, pkg) in known.items()}


def test_every_module_has_a_layer(graph):
    assert not [m for m in graph if (m.split(".")[1] if m != "minillm" else "__init__") not in LAYERS]


def violations(graph) -> list[str]:
    bad = []
    for m, targets in graph.items():
        (mk, ml) = layer_of(m)
        for t in targets:
            tk, tl = layer_of(t)
            if tl > ml or (tl == ml and mk != tk) or (mk == "viz" and tk in TOOLS):
                bad.append(f"{m} ({mk}, layer {ml}) imports {t} ({tk}, layer {tl})")
    return sorted(bad)


def test_imports_point_down_the_layers(graph):
    bad = violations(graph)
    assert not bad, "imports that point up or across the layers:\n" + "\n".join(bad)


def circles(graph) -> list:
    """Tarjan's strongly connected components over module -> module arrows (packages' faces excluded: importing
    a submodule runs its package's __init__, which is not an arrow of the code)."""
    g = {m: {t for t in ts if not modules_is_face(t)} for m, ts in graph.items() if not modules_is_face(m)}
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                circles.append(sorted(comp))

    for v in g:
        if v not in index:
            visit(v)
    return circles


def test_no_import_circles(graph):
    assert not circles(graph), f"modules that import each other in a circle: {circles(graph)}"


def modules_is_face(name: str) -> bool:
    path = os.path.join(ROOT, *name.split(".")[1:], "__init__.py") if name.startswith("minillm.") else ""
    return name in ("minillm", "minillm.kernels", "minillm.viz") or os.path.exists(path)


def test_the_checkers_see_an_upward_import_and_a_circle(graph):
    fake = dict(graph)
    fake["minillm.core.scheduler"] = graph["minillm.core.scheduler"] | {"minillm.engine.engine"}
    fake["minillm.quantization.awq"] = graph["minillm.quantization.awq"] | {"minillm.backends.capabilities"}
    assert violations(fake) == [
        "minillm.core.scheduler (core, layer 3) imports minillm.engine.engine (engine, layer 5)",
        "minillm.quantization.awq (quantization, layer 4) imports minillm.backends.capabilities (backends, layer 4)"]
    planted = {"minillm.cluster.replica": "minillm.bench.sched",           # a tool importing one above it
               "minillm.training.moe_ship": "minillm.serve.app",          # sideways between two tools
               "minillm.viz.serving": "minillm.bench.replay",             # viz running a workload
               "minillm.kv_eviction.policies": "minillm.scheduling.radix"}   # one plug-in importing another
    fake = dict(graph)
    for m, t in planted.items():
        fake[m] = graph[m] | {t}
    assert violations(fake) == sorted(
        f"{m} ({layer_of(m)[0]}, layer {layer_of(m)[1]}) imports {t} ({layer_of(t)[0]}, layer {layer_of(t)[1]})"
        for m, t in planted.items())
    fake["minillm.llama.kv_cache"] = graph["minillm.llama.kv_cache"] | {"minillm.llama.transformer"}
    assert ["minillm.llama.kv_cache", "minillm.llama.transformer"] in circles(fake)


def test_old_import_paths_warn_or_name_the_new_ones():
    import importlib
    import warnings
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        old = importlib.import_module("minillm.scheduler")
    new = importlib.import_module("minillm.core.scheduler")
    assert old is new and any("minillm.scheduler moved to minillm.core.scheduler" in str(x.message) for x in w)
    with pytest.raises(ImportError, match="minillm.quant was split .* minillm.llama.linears"):
        importlib.import_module("minillm.quant")
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        from minillm.bench import bench_decode  # noqa: F401
    assert any("minillm.bench.bench_decode moved to minillm.bench.decode.bench_decode" in str(x.message) for x in w)


def test_nothing_of_ours_uses_an_old_import_path():
    """The old paths are for users' notebooks; the package, its tests and its notebooks use the new ones."""
    import glob
    import json

    from minillm._moved import MOVED, SPLIT
    old = set(MOVED) | set(SPLIT)
    found = []
    files = glob.glob(os.path.join(ROOT, "**", "*.py"), recursive=True)
    files += glob.glob(os.path.join(ROOT, "notebooks", "*.ipynb"))
    for path in files:
        if "/.venv/" in path or path.endswith(("_moved.py", "test_layers.py")) or "/build/" in path:
            continue
        text = open(path).read()
        sources = ["".join(c["source"]) for c in json.loads(text)["cells"] if c["cell_type"] == "code"] \
            if path.endswith(".ipynb") else [text]
        for src in sources:
            for node in ast.walk(ast.parse(src)):
                names = []
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
                elif isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                found += [f"{os.path.relpath(path, ROOT)}: {n}" for n in names if n in old]
    assert not found, "old import paths in use:\n" + "\n".join(found)


# ---------------------------------------------------------------------------- features are objects, not branches
HOT_FILES = ("core/scheduler.py", "core/model_runner.py", "core/verify.py", "engine/engine.py")
FEATURES = {"eviction", "lora", "adapters", "groups", "beam", "swap", "proposer", "guide", "guided", "jump_forward",
            "post", "logprobs", "spec", "speculative", "medusa", "draft_model"}


def feature_branches(path: str) -> list[str]:
    """`if self.<feature> is (not) None` (or a truth test of it) in a file: a feature tested inside the core's hot
    files instead of arriving as an object whose default does nothing (minillm.core.hooks)."""
    def feature(node) -> str | None:          # self.x.y.z -> "x.y.z" if any of x, y, z names a feature
        chain = []
        while isinstance(node, ast.Attribute):
            chain.append(node.attr)
            node = node.value
        if isinstance(node, ast.Name) and node.id == "self" and FEATURES & set(chain):
            return ".".join(reversed(chain))
        return None

    found = []
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)):
            test = node.test.operand if isinstance(node.test, ast.UnaryOp) else node.test
            if isinstance(test, ast.Compare) and isinstance(test.ops[0], (ast.Is, ast.IsNot)):
                test = test.left
            name = feature(test)
            if name:
                found.append(f"{os.path.relpath(path, ROOT)}:{node.lineno} tests self.{name}")
    return found


def test_no_feature_is_a_branch_in_the_hot_files():
    bad = [b for f in HOT_FILES for b in feature_branches(os.path.join(ROOT, "minillm", f))]
    assert not bad, "features tested by branches (give the part a null object instead):\n" + "\n".join(bad)


def test_the_branch_check_sees_a_planted_branch(tmp_path):
    planted = tmp_path / "scheduler.py"
    planted.write_text("class S:\n    def admit(self, seq):\n        if self.eviction is not None:\n            pass\n"
                       "        x = 1 if self.lora else 0\n        if not self.groups:\n            pass\n")
    assert sorted(b.split(" tests ")[1] for b in feature_branches(str(planted))) == \
        ["self.eviction", "self.groups", "self.lora"]
