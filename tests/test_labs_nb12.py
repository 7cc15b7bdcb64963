"""Notebook 12's checkers (minillm.labs.nb12_parallelism): each common mistake is named, a function travels to another
process whole (code, globals, defaults), and the core checker grades a right answer on real ranks.
tests/test_exercises.py runs the notebook's own solutions and stubs; here, the wrong answers."""
import math

import pytest
import torch

from minillm.labs import check_allreduce_bytes, check_bubble_fraction, check_row_parallel_linear
from minillm.labs.nb12_parallelism import _diagnose, ship, unship


def _rows(x_part, w, rank):
    k = x_part.shape[1]
    return x_part @ w[rank * k:(rank + 1) * k]                               # (N, M) this rank's partial sum


def right(x_part, w, b, rank, world, all_reduce):
    return all_reduce(_rows(x_part, w, rank)) + b


def no_all_reduce(x_part, w, b, rank, world, all_reduce):
    return _rows(x_part, w, rank) + b


def all_reduce_first(x_part, w, b, rank, world, all_reduce):
    return _rows(all_reduce(x_part.clone()), w, rank) + b


def wrong_dimension(x_part, w, b, rank, world, all_reduce):
    m = w.shape[1] // world
    return all_reduce(x_part @ w[:, rank * m:(rank + 1) * m]) + b          # w's columns: shapes do not meet


def bias_every_rank(x_part, w, b, rank, world, all_reduce):
    return all_reduce(_rows(x_part, w, rank) + b)


def same_rows(x_part, w, b, rank, world, all_reduce):
    return all_reduce(x_part @ w[:x_part.shape[1]]) + b


def rank0_only(x_part, w, b, rank, world, all_reduce):
    y = _rows(x_part, w, rank)
    return (all_reduce(y) if rank == 0 else y) + b


def output_slice(x_part, w, b, rank, world, all_reduce):
    m = w.shape[1] // world
    return (all_reduce(_rows(x_part, w, rank)) + b)[:, rank * m:(rank + 1) * m]


@pytest.mark.parametrize("fn,named", [
    (no_all_reduce, "forgetting the all-reduce"),
    (all_reduce_first, "all-reducing before the matmul"),
    (wrong_dimension, "Splitting the wrong dimension"),
    (bias_every_rank, "adding the bias on every rank"),
    (same_rows, "the same rows of w"),
    (rank0_only, "all_reduce is a collective"),
    (output_slice, "a slice of the output"),
])
def test_row_parallel_mistakes_are_named(fn, named):
    """Each mistake fails on the simulated ranks (before any real rank is started) with its name in the message."""
    result = check_row_parallel_linear(fn)
    assert not result.passed and named in result.message, result.message


def test_simulated_ranks_accept_both_bias_placements():
    """After the all-reduce on every rank, or before it on rank 0 only (vLLM's RowParallelLinear): both right."""
    def bias_on_rank0(x_part, w, b, rank, world, all_reduce):
        y = _rows(x_part, w, rank)
        return all_reduce(y + b if rank == 0 else y)
    for fn in (right, bias_on_rank0):
        for N, K, M, p in ((3, 8, 5, 2), (2, 12, 7, 4), (4, 6, 6, 3)):
            _diagnose(fn, N, K, M, p)                                        # raises AssertionError if wrong


def _uses_math_and_helper(x, scale=3.0):
    return math.sqrt(_rows(x, torch.eye(2, dtype=x.dtype), 0).sum().item() + 0 * scale) * scale


def test_ship_rebuilds_code_globals_and_defaults():
    """What travels to a rank: the code object, the modules it reads (by name), the helper functions it calls (shipped
    the same way), its defaults. Rebuilt in a namespace of its own, it computes what the original does."""
    blob = ship(_uses_math_and_helper)
    fn = unship(blob)
    assert fn is not _uses_math_and_helper and fn.__globals__ is not globals()
    x = torch.tensor([[4.0, 5.0]])
    assert fn(x) == _uses_math_and_helper(x) == 9.0


def test_ship_refuses_a_closure_by_name():
    def outer():
        k = 2

        def inner(x_part, w, b, rank, world, all_reduce):
            return x_part * k
        return inner
    with pytest.raises(AssertionError, match="defined inside another function"):
        ship(outer())


def test_warm_up_mistakes_are_named():
    r = check_allreduce_bytes(lambda L, C, p, e: L * C * e * 2 * (p - 1) / p)        # one all-reduce per layer
    assert not r and "there are two" in r.message
    r = check_allreduce_bytes(lambda L, C, p, e: 2 * L * C * e * 2 * (p - 1))        # every rank together
    assert not r and "p ranks send together" in r.message
    assert check_allreduce_bytes(lambda L, C, p, e: 4 * L * C * e * (p - 1) / p)
    r = check_bubble_fraction(lambda p, m: (p - 1) / m)
    assert not r and "idle time over compute time" in r.message
    r = check_bubble_fraction(lambda p, m: m / (m + p - 1))
    assert not r and "busy fraction" in r.message


def test_core_checker_runs_a_right_answer_on_real_ranks():
    """The whole checker: simulated ranks, then the shipped model on 2 real gloo ranks (started and closed here when
    no group of 2 is running), logits against one rank's in float64."""
    result = check_row_parallel_linear(right)
    assert result.passed, result.message
    assert "2 real ranks" in result.message and "786,432 bytes" in result.message
