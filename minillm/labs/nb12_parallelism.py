"""Checkers for notebook 12_parallelism: all-reduce bytes per token, the GPipe bubble, and the row-parallel linear.

The core exercise is graded twice. First on simulated ranks: one thread per rank in this process, with an all_reduce
that really sums across the threads, so every mistake can be named (and a function that would leave a rank waiting
in a collective fails here, not on the real group). Then for real: the function is shipped to the rank group's
processes (its code object by marshal, the globals it reads by name or by pickle: inspect.getsource would need the
cell's text, which a graded or exec'd cell does not keep) and runs the wo and w2 projections of every layer of the
shipped model inside minillm.parallel's own tensor-parallel forward (TensorShard.run), checked against one rank.
"""
from __future__ import annotations

import builtins
import dis
import importlib
import marshal
import pickle
import threading
import types

import torch

from .common import checker

__all__ = ["check_allreduce_bytes", "check_bubble_fraction", "check_row_parallel_linear"]

# ---------------------------------------------------------------------------- warm-up: all-reduce bytes per token
_BYTES_CASES = ((8, 256, 2, 4), (8, 256, 4, 2), (32, 4096, 8, 2), (1, 64, 3, 4), (12, 768, 1, 4))


@checker(signature="n_layers, dim, world, elem_bytes")
def check_allreduce_bytes(fn):
    """fn(n_layers, dim, world, elem_bytes) -> the bytes ONE rank sends in the ring all-reduces of one decoded token's
    tensor-parallel forward: 2 all-reduces per layer of (dim,) activations, each rank sending 2 (p - 1) / p of it."""
    from types import SimpleNamespace

    from ..parallel import tp_bytes_per_token
    for L, C, p, e in _BYTES_CASES:
        cfg = SimpleNamespace(n_layers=L, dim=C, vocab_size=64 * p)
        payload = tp_bytes_per_token(cfg, p, e)["all_reduce"]     # what each rank hands in (minillm.parallel)
        want = payload * 2 * (p - 1) / p
        got = fn(L, C, p, e)
        case = f"(n_layers={L}, dim={C}, world={p}, elem_bytes={e})"
        assert isinstance(got, (int, float)) and not isinstance(got, bool), \
            f"returned {type(got).__name__} {got!r}: a number of bytes"
        if abs(got - want) <= 1e-9 * max(1.0, want):
            continue
        mistakes = [(payload / 2 * 2 * (p - 1) / p, "one all-reduce per layer: there are two (after attention and "
                                                   "after the MLP)"),
                    (payload, "that is the payload each rank hands in; a ring sends 2 (p - 1) / p of it per rank "
                              "(a reduce-scatter and an all-gather, each (p - 1) / p)"),
                    (payload * 2 * (p - 1), "that is what the p ranks send together; one rank sends 1/p of it"),
                    (payload * (p - 1) / p, "a ring all-reduce has two phases (reduce-scatter, then all-gather), "
                                            "each sending (p - 1) / p of the tensor"),
                    (payload * 8 * 2 * (p - 1) / p, "bits, not bytes")]
        for wrong, why in mistakes:
            if abs(got - wrong) <= 1e-9 * max(1.0, wrong):
                assert False, f"{case}: got {got:,.0f}: {why}; want {want:,.0f}"
        assert False, f"{case}: got {got:,.1f}, want {want:,.1f} = 2 all-reduces x {L} layers x {C} x {e} bytes x " \
                      f"2 ({p} - 1) / {p}"
    return (f"2 all-reduces per layer, each rank sending 2 (p - 1) / p of the payload: the shipped model (8 layers, "
            f"C 256, float32) at p = 2 sends {fn(8, 256, 2, 4):,.0f} bytes per token per rank, at p = 8 "
            f"{fn(8, 256, 8, 4):,.0f}")


# ---------------------------------------------------------------------------- warm-up: the GPipe bubble
@checker(signature="p, m")
def check_bubble_fraction(fn):
    """fn(p, m) -> the fraction of a GPipe step each of p equal stages idles with m micro-batches."""
    from ..parallel import gpipe_bubble
    for p, m in ((2, 1), (2, 4), (4, 1), (4, 8), (8, 32), (1, 5), (3, 2)):
        want, got = gpipe_bubble(p, m), fn(p, m)
        case = f"(p={p} stages, m={m} micro-batches)"
        assert isinstance(got, (int, float)) and not isinstance(got, bool), \
            f"returned {type(got).__name__} {got!r}: a fraction"
        if abs(got - want) < 1e-12:
            continue
        mistakes = {(p - 1) / m: "that is idle time over compute time; the fraction is of the whole step, which "
                                 "lasts m + p - 1 micro-batch times",
                    m / (m + p - 1): "that is the busy fraction; the bubble is the idle one",
                    (p - 1) / (m + p): "the step lasts m + p - 1 micro-batch times (the last stage starts after p - 1)",
                    (p - 1) / p: "without micro-batches in it: more micro-batches shrink the bubble"}
        for wrong, why in mistakes.items():
            if abs(got - wrong) < 1e-12:
                assert False, f"{case}: got {got:.4f}: {why}; want {want:.4f}"
        assert False, f"{case}: got {got:.4f}, want (p - 1) / (m + p - 1) = {want:.4f}"
    return "(p - 1) / (m + p - 1): a stage idles p - 1 of the m + p - 1 micro-batch times of a step"


# ---------------------------------------------------------------------------- core: simulated ranks
_SIM_TIMEOUT_S = 5.0
# (N rows, K inputs, M outputs, world): odd sizes, a square one (a transposed weight fits it), the shipped model's wo
# and w2 at p = 2 (the real run's shapes, so that what passes here cannot leave a real rank waiting)
_SIM_CASES = ((3, 8, 5, 2), (4, 12, 12, 4), (1, 6, 7, 3), (5, 10, 10, 1), (24, 256, 256, 2), (24, 768, 256, 2))


class _SimGroup:
    """world threads standing in for ranks: all_reduce(t) sums every rank's t into each one's, in place."""

    def __init__(self, world: int):
        self.world = world
        self.barrier = threading.Barrier(world, timeout=_SIM_TIMEOUT_S)
        self.slots, self.calls = [None] * world, [[] for _ in range(world)]

    def all_reduce_for(self, rank: int):
        def all_reduce(t):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"all_reduce takes a tensor, got {type(t).__name__}")
            if not t.is_contiguous():
                raise ValueError("all_reduce needs a contiguous tensor (torch.distributed's rule): .contiguous() it")
            self.calls[rank].append(tuple(t.shape))
            self.slots[rank] = t.detach().clone()
            self.barrier.wait()                     # every rank has handed in its tensor
            shapes = {tuple(s.shape) for s in self.slots}
            if len(shapes) > 1:
                raise ValueError(f"the ranks handed all_reduce tensors of different shapes {sorted(shapes)}")
            total = self.slots[0].clone()
            for s in self.slots[1:]:
                total += s                          # the same order on every rank: the same sum, bit for bit
            self.barrier.wait()                     # every rank has read every slot
            with torch.no_grad():
                t.copy_(total)
            return t
        return all_reduce

    def run(self, fn, inputs: list) -> list:
        """fn(*inputs[r], all_reduce) on each rank's thread -> [output or the exception raised, per rank]. A rank
        that raises breaks the barrier (nobody will pair with the others); a rank left waiting by a partner that
        finished (a mismatched number of calls) gives up after _SIM_TIMEOUT_S."""
        out = [None] * self.world

        def rank_main(r):
            try:
                out[r] = fn(*inputs[r], self.all_reduce_for(r))
            except BaseException as e:              # noqa: BLE001 (handed to the diagnosis)
                out[r] = e
                self.barrier.abort()
        threads = [threading.Thread(target=rank_main, args=(r,), daemon=True) for r in range(self.world)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(3 * _SIM_TIMEOUT_S)
        return out


def _shards(N: int, K: int, M: int, p: int, seed: int) -> tuple:
    """x (N, K), w (K, M), b (M,) in float64, and each rank's inputs (x_part, w, b, rank, world)."""
    g = torch.Generator().manual_seed(seed)
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((N, K), (K, M), (M,)))
    k = K // p
    inputs = [(x[:, r * k:(r + 1) * k].clone(), w.clone(), b.clone(), r, p) for r in range(p)]   # x_part (N, K/p)
    return x, w, b, inputs


def _diagnose(fn, N: int, K: int, M: int, p: int, seed: int = 0):
    """Run fn on p simulated ranks; assert with the mistake's name unless every rank returns x @ w + b."""
    x, w, b, inputs = _shards(N, K, M, p, seed)
    sim = _SimGroup(p)
    outs = sim.run(fn, inputs)
    case = f"(x (N={N}, K={K}) split over world={p} ranks, w (K={K}, M={M}))"
    calls = [len(c) for c in sim.calls]
    k = K // p
    errors = [(r, o) for r, o in enumerate(outs) if isinstance(o, BaseException)]
    first = next(((r, o) for r, o in errors if not isinstance(o, threading.BrokenBarrierError)), None)
    if first is None and errors or first is not None and "different shapes" in str(first[1]):
        assert False, (f"all_reduce is a collective: every rank must call it, as often as the others, with a tensor "
                       f"of the same shape; here the ranks called it {calls} times, with shapes {sim.calls} {case}")
    if first is not None:
        r, o = first
        if isinstance(o, NotImplementedError):
            raise o
        shape_error = any(s in str(o) for s in ("mat1 and mat2", "size mismatch", "shapes cannot"))
        if isinstance(o, RuntimeError) and shape_error:
            assert False, (f"rank {r}: {o}. Splitting the wrong dimension? x_part holds x's columns "
                           f"[rank K/world, (rank+1) K/world): they meet the SAME rows of w "
                           f"(w[rank * {k}:(rank + 1) * {k}], shape ({k}, {M})), not w's columns (its outputs) {case}")
        raise AssertionError(f"rank {r} raised {type(o).__name__}: {o} {case}") from o
    for r, o in enumerate(outs):
        assert isinstance(o, torch.Tensor), f"rank {r} returned {type(o).__name__}, not a tensor (N, M) {case}"
        if tuple(o.shape) != (N, M):
            hint = (": that is a slice of the output (a column-parallel layer's); a row-parallel layer's output is "
                    "whole, (N, M), on every rank" if p > 1 and tuple(o.shape) in ((N, M // p), (N // p, M)) else "")
            assert False, f"rank {r} returned shape {tuple(o.shape)}, want (N, M) = {(N, M)}{hint} {case}"
    want = x @ w + b                                                              # (N, M)
    if all(torch.allclose(o.double(), want, atol=1e-10, rtol=1e-10) for o in outs):
        return
    parts = [x[:, r * k:(r + 1) * k] @ w[r * k:(r + 1) * k] for r in range(p)]     # (N, M) each rank's partial sum
    if p > 1 and calls == [0] * p:
        assert False, (f"forgetting the all-reduce: all_reduce was never called, so each rank holds only its partial "
                       f"sum x_part @ w[its rows]; the p partial sums add up (all_reduce) to x @ w {case}")
    if p > 1 and any((N, k) in c and (N, M) not in c for c in sim.calls) and k != M:
        assert False, (f"all-reducing before the matmul: you summed the ranks' x_part {(N, k)} (different columns "
                       f"of x: adding them mixes unrelated features); multiply first, then all-reduce the (N, M) "
                       f"partial products {case}")
    xsum = sum(x[:, r * k:(r + 1) * k] for r in range(p))                           # (N, K/p)
    mistakes = {
        "all-reducing before the matmul: you summed the ranks' x_part (different columns of x) and multiplied "
        "the sum; multiply first, then all-reduce the (N, M) partial products":
            [xsum @ w[r * k:(r + 1) * k] + b for r in range(p)],
        f"adding the bias on every rank before the all-reduce: the sum then holds it {p} times; add it once "
        "(after the all-reduce, or on rank 0 only before it, as vLLM's RowParallelLinear does)":
            [x @ w + p * b] * p,
        "the bias is missing": [x @ w] * p,
        f"every rank multiplied by the same rows of w (the first K/world = {k}); rank r's columns of x meet w's rows "
        f"[r K/world, (r+1) K/world)": [xsum @ w[:k] + b] * p,
        "forgetting the all-reduce: each rank returned only its partial sum": [parts[r] + b for r in range(p)],
    }
    if K == M:
        mistakes["splitting the wrong dimension: you took w's columns (its outputs) and transposed them; a "
                 "row-parallel layer takes w's rows, the inputs that x_part's columns feed"] = \
            [sum(x[:, r * k:(r + 1) * k] @ w[:, r * k:(r + 1) * k].T for r in range(p)) + b] * p
    for why, wrong in mistakes.items():
        if all(torch.allclose(o.double(), v, atol=1e-10, rtol=1e-10) for o, v in zip(outs, wrong)):
            assert False, f"{why} {case}"
    if any(not torch.equal(outs[0], o) for o in outs[1:]):
        assert False, f"the ranks returned different outputs: after the all-reduce each rank holds the same sum {case}"
    err = max((o.double() - want).abs().max().item() for o in outs)
    assert False, f"max abs error {err:.3g} against x @ w + b (tolerance 1e-10 in float64) {case}"


# ---------------------------------------------------------------------------- core: real ranks
def _global_names(code) -> set:
    """The global names a code object (and the functions defined inside it) reads."""
    names = {i.argval for i in dis.get_instructions(code) if i.opname in ("LOAD_GLOBAL", "LOAD_NAME")}
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _global_names(c)
    return names


def ship(fn) -> tuple:
    """fn as plain bytes that another process of the same Python rebuilds (unship): its code object (marshal), the
    globals it reads (modules by name, functions shipped alike, anything else pickled) and its defaults."""
    if fn.__closure__:
        raise AssertionError(f"{fn.__name__} is defined inside another function (it closes over "
                             f"{fn.__code__.co_freevars}); define it at the top level of its cell")
    glob = {}
    for name in sorted(_global_names(fn.__code__)):
        if name not in fn.__globals__:
            continue                                                   # a builtin
        v = fn.__globals__[name]
        if isinstance(v, types.ModuleType):
            glob[name] = ("module", v.__name__)
        elif isinstance(v, types.FunctionType) and v is not fn:
            glob[name] = ("function", ship(v))
        elif v is not fn:
            try:
                glob[name] = ("value", pickle.dumps(v))
            except Exception as e:                                     # noqa: BLE001 (said by name)
                raise AssertionError(f"{fn.__name__} reads the global {name!r} ({type(v).__name__}), which cannot "
                                     f"travel to another rank's process ({e})") from None
    return marshal.dumps(fn.__code__), glob, pickle.dumps(fn.__defaults__), fn.__name__


def unship(blob: tuple):
    code, glob, defaults, name = blob
    g = {"__builtins__": builtins, "__name__": "__rank__"}
    fn = types.FunctionType(marshal.loads(code), g, name, pickle.loads(defaults))
    g[name] = fn                                                       # it may call itself
    for n, (kind, v) in glob.items():
        g[n] = importlib.import_module(v) if kind == "module" else unship(v) if kind == "function" else pickle.loads(v)
    return fn


class _RowParallelComm:
    """A rank's Comm as TensorShard.run sees it, except that each all-reduce point runs the reader's row-parallel
    linear: the shard's wo and w2 are identities, so what reaches all_reduce is the layer's input shard x_part
    (B, T, K/p), and the reader's function multiplies it by the full weight's rows and all-reduces."""

    def __init__(self, comm, fn, weights: list, rank: int, world: int):
        self.comm, self.fn, self.weights, self.rank, self.world = comm, fn, weights, rank, world
        self.timeline, self.all_gather, self.calls = comm.timeline, comm.all_gather, 0

    def all_reduce(self, h):
        B, T, k = h.shape
        w = self.weights[self.calls]                                  # (K, M): layer i's wo.T, then its w2.T
        self.calls += 1
        b = torch.zeros(w.shape[1], dtype=w.dtype)                    # (M,) Llama's linears have no bias
        y = self.fn(h.reshape(B * T, k).contiguous(), w, b, self.rank, self.world, self.comm.all_reduce)
        return y.reshape(B, T, -1)                                    # (B, T, C)


def _student_forward(state, blob, tokens, payload) -> dict:
    """On every rank: the tensor-parallel forward with the reader's function at each all-reduce point (a module-level
    function: RankGroup.call ships it by name). -> rank 0's logits, the all_reduce bytes handed in, or the error."""
    from ..parallel.tensor import TensorShard
    cfg, p, r, weights, full = payload
    try:
        fn = unship(blob)
        shard = TensorShard(cfg, p, r, weights)
        comm = _RowParallelComm(state.comm, fn, full, r, p)
        state.comm.begin_step()
        B, T = tokens.shape
        with torch.inference_mode():
            logits = shard.run(comm, tokens, torch.arange(T).expand(B, T))    # (B, T, V)
    except Exception as e:                                                     # noqa: BLE001 (reported by rank 0)
        return {"error": f"rank {r}: {type(e).__name__}: {e}"}
    return {"logits": logits if r == 0 else None, "all_reduce_bytes": state.comm.steps[-1]["all_reduce"],
            "calls": comm.calls}


def _payloads(net, p: int) -> list:
    """Per rank: the shard's weights with wo and w2 as identities (the reader's function applies them), and every
    layer's full wo.T and w2.T, (K, M) each, as a checkpoint would hand them to every rank."""
    from ..parallel.tensor import split_weights
    cfg, out = net.config, []
    full = []
    for blk in net.layers:
        full += [blk.attention.wo.weight.detach().T.contiguous(),      # (H D, C)
                 blk.feed_forward.w2.weight.detach().T.contiguous()]   # (F, C)
    for r in range(p):
        w = split_weights(net, p, r)
        for lw in w["layers"]:
            lw["wo"] = torch.eye(lw["wo"].shape[1], dtype=lw["wo"].dtype)   # (H/p D, H/p D)
            lw["w2"] = torch.eye(lw["w2"].shape[1], dtype=lw["w2"].dtype)   # (F/p, F/p)
        out.append((cfg, p, r, w, full))
    return out


def _run_on_ranks(fn) -> str:
    """The shipped model in float64, tensor-parallel over 2 real ranks with fn doing wo and w2 in every layer,
    against one rank. The running group of 2 ranks is reused (the notebook's); otherwise one is started and closed."""
    from ..formats.loader import load
    from ..parallel import RankGroup, current_group
    net = load("shakespeare", None, "float64", 0)[0]
    cfg, p = net.config, 2
    blob = ship(fn)
    tokens = torch.randint(0, cfg.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))   # (B, T)
    group = current_group()
    own = group is None or group.world != p
    if own:
        group = RankGroup(p, timeout_s=20.0)
    try:
        results = group.call(_student_forward, blob, tokens, each=_payloads(net, p))
    finally:
        if own:
            group.close()
    errors = [res["error"] for res in results if "error" in res]
    assert not errors, "on the real ranks: " + "; ".join(errors)
    with torch.inference_mode():
        want = net(tokens)                                                     # (B, T, V) one rank
    got = results[0]["logits"]
    err = (got - want).abs().max().item()
    # float64: the row-parallel sums run in another order than one rank's (halves, then across ranks): ~1e-14 on
    # logits of ~10; 1e-9 is far above that and far below any real mistake (a wrong shard moves logits by ~1)
    assert err < 1e-9, f"on the real ranks the logits differ from one rank's by {err:.3g} (tolerance 1e-9, float64)"
    B, T = tokens.shape
    formula = 2 * cfg.n_layers * B * T * cfg.dim * 8
    counted = results[0]["all_reduce_bytes"]
    assert counted == formula, (f"your all_reduce calls were handed {counted:,} bytes in the forward; the formula "
                                f"2 L B T C x 8 gives {formula:,}: one all-reduce of the (N, M) output per linear")
    return (f"simulated ranks: every case right; then on {p} real ranks (gloo) the shipped model's {cfg.n_layers} "
            f"layers ran wo and w2 through your function ({results[0]['calls']} all-reduces, {counted:,} bytes handed "
            f"in, = 2 L B T C x 8): logits within 1e-9 of one rank's (float64)")


@checker(kind="core", signature="x_part, w, b, rank, world, all_reduce")
def check_row_parallel_linear(fn):
    """fn(x_part, w, b, rank, world, all_reduce) -> y (N, M), the same on every rank: y = x @ w + b where rank holds
    x_part = x[:, rank K/world : (rank+1) K/world] (N, K/world) and is handed the whole w (K, M) and b (M,)."""
    for i, (N, K, M, p) in enumerate(_SIM_CASES):
        _diagnose(fn, N, K, M, p, seed=i)
    return _run_on_ranks(fn)
