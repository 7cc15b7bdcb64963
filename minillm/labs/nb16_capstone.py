"""Checkers for notebook 16_capstone: seats in a KV budget (warm-up), and the reader's configuration or scheduling
order served on the capstone's trace, graded on goodput against the reference configuration (core)."""
from __future__ import annotations

import random

from .common import checker


@checker(signature="budget_bytes, bytes_per_token, block_size, lengths")
def check_kv_seats(fn):
    """fn(budget_bytes, bytes_per_token, block_size, lengths) -> how many of the sequences (lengths in tokens, taken
    in order) fit in a KV pool of budget_bytes at once, each holding whole blocks of block_size tokens"""
    from ..core.block_manager import BlockManager

    def reference(budget, per_token, bs, lengths):
        blocks = BlockManager(budget // (bs * per_token), bs)
        n, free = 0, blocks.num_blocks
        for length in lengths:
            need = blocks.blocks_for(length)
            if need > free:
                break
            n, free = n + 1, free - need
        return n
    cases = [(4 * 512 * 64, 64, 512, [100, 20, 300, 50, 7]),         # a contiguous cache: a whole context each
             (4 * 512 * 64, 64, 16, [100, 20, 300, 50, 7, 400, 9]),
             (1000 * 8, 8, 16, [17, 16, 33, 1, 15]), (3 * 16 * 4, 4, 16, [16, 16, 16, 1]),
             (10 * 16 * 2, 2, 16, [17, 17, 17, 17, 17, 17])]
    rng = random.Random(16)                                         # hidden cases: sizes no stub can be tuned to
    cases += [(rng.randrange(1, 60) * 32 * 8, 8, rng.choice((8, 16, 32)), [rng.randrange(1, 300) for _ in range(9)])
              for _ in range(4)]
    gots = [fn(budget, per_token, bs, list(lengths)) for budget, per_token, bs, lengths in cases]
    wants = [reference(*c) for c in cases]
    if gots == wants:
        return "whole blocks per sequence, rounded up, until the pool runs out: paging seats many more than a " \
               "contiguous cache"
    mistakes = {"you counted tokens, not whole blocks: a sequence holds ceil(n / block_size) blocks, and a block's "
                "last slots stay empty until it grows": lambda b, t, bs, ls: _fit(ls, b // (bs * t) * bs, lambda n: n),
                "round a sequence's blocks up, not down: 17 tokens in blocks of 16 need 2 blocks":
                    lambda b, t, bs, ls: _fit(ls, b // (bs * t), lambda n: n // bs)}
    for why, wrong in mistakes.items():
        if gots == [wrong(*c) for c in cases]:
            raise AssertionError(why)
    i = next(i for i, (g, w) in enumerate(zip(gots, wants)) if g != w)
    budget, per_token, bs, lengths = cases[i]
    raise AssertionError(f"budget {budget} bytes, {per_token} bytes per token, blocks of {bs}, lengths {lengths}: "
                         f"got {gots[i]}, expected {wants[i]} ({budget // (bs * per_token)} blocks in the pool)")


def _fit(lengths, capacity, cost) -> int:
    """How many of lengths fit, in order, when each costs cost(n) of the capacity."""
    used, n = 0, 0
    for length in lengths:
        used += cost(length)
        if used > capacity:
            break
        n += 1
    return n


# ---------------------------------------------------------------- core: the reader's configuration on the trace
_SETUP: dict = {}


def _setup():
    """The capstone's trace, SLO and the reference's score, on the fixed cost model (computed once per process)."""
    if not _SETUP:
        from ..bench import capstone
        from ..formats.loader import load
        model, tok = load("shakespeare")
        s = capstone.setup(model, tok)
        _SETUP.update(model=model, tok=tok, setup=s,
                      reference=capstone.score(model, tok, capstone.REFERENCE_OPTIONS, setup_=s, label="reference"),
                      plain=capstone.score(model, tok, {}, setup_=s, label="plain"))
    return _SETUP


@checker(kind="core", signature="", allow=("minillm.scheduling.orders.Order", "minillm.core.order.Order"))
def check_capstone(fn):
    """fn() -> (options, order): EngineConfig options over the plain engine's, and a scheduling Order or None;
    served on the capstone's trace, they must reach the reference configuration's goodput"""
    from ..bench import capstone
    from ..core.order import Order
    from ..core.policies import batching_policy
    got = fn()
    assert isinstance(got, tuple) and len(got) == 2, f"return (options, order), a pair; got {got!r:.80}"
    options, order = got
    assert isinstance(options, dict), f"options must be a dict of EngineConfig options, got {options!r:.80}"
    fixed = [k for k in options if k in capstone.FIXED]
    assert not fixed, f"{fixed} are the task's, not yours to change: the KV budget and the trace are fixed"
    assert order is None or isinstance(order, Order), f"order must be an Order or None, got {order!r:.80}"
    s = _setup()
    policy = None
    if order is not None:
        from ..config import EngineConfig
        config = EngineConfig(**capstone._options(s["model"], {**options, "scheduling_policy": "fcfs"}))
        policy = batching_policy(config, order)
    mine = capstone.score(s["model"], s["tok"], options, policy, setup_=s["setup"], label="yours")
    ref, plain = s["reference"]["goodput"], s["plain"]["goodput"]
    g = mine["goodput"]
    detail = (f"goodput {g:.2f} requests/s ({mine['slo_attained']:.0%} of the requests met the SLO): "
              f"{g / plain:.2f}x the plain engine's {plain:.2f}, {g / ref:.2f}x the reference's {ref:.2f}")
    if g < 0.98 * ref:
        hints = []
        if not options.get("enable_prefix_caching"):
            hints.append("every chat request repeats the same system prompt: prefix caching computes it once")
        if options.get("block_size", capstone.MAX_MODEL_LEN) >= capstone.MAX_MODEL_LEN:
            hints.append("a contiguous cache (block_size = max_model_len) seats 4 sequences in this budget")
        if not options.get("enable_chunked_prefill"):
            hints.append("a long document's prompt in one step stalls every decode beside it: chunked prefill")
        raise AssertionError(detail + ". " + ("; ".join(hints) or "compare with the waterfall above") + ".")
    return detail
