"""Notebook 14's checker: the sliding-window block policy passes and runs in the engine; the common mistakes fail with
a message that names them; a student function that raises or returns nonsense fails cleanly, and the next (correct)
attempt passes (nothing left behind)."""
import torch

from minillm.labs import check_window_mask, check_window_victims


def victims(n_cache, n_blocks, block_size, sinks, window):
    first = -(-sinks // block_size)
    last = (n_cache - window + 1) // block_size
    return list(range(first, min(last, n_blocks - 1)))


def test_solution_passes_in_the_engine():
    r = check_window_victims(victims)
    assert r, r.message
    assert "plugged into the engine" in r.message and "blocks freed" in r.message


def test_mistakes_are_named():
    sink = check_window_victims(lambda n, nb, bs, s, w: list(range(0, min((n - w + 1) // bs, nb - 1))))
    assert not sink and "attention sink" in sink.message
    early = check_window_victims(lambda n, nb, bs, s, w: list(range(-(-s // bs), min((n - w) // bs + 1, nb - 1))))
    assert not early and "still sees token" in early.message
    never = check_window_victims(lambda n, nb, bs, s, w: [])
    assert not never and "would grow" in never.message
    floor = check_window_victims(lambda n, nb, bs, s, w: list(range(s // bs, min((n - w + 1) // bs, nb - 1))))
    assert not floor and "attention sink" in floor.message       # sinks // bs: a partly-sink block freed


def test_bad_student_code_fails_cleanly_then_passes():
    def boom(n_cache, n_blocks, block_size, sinks, window):
        raise RuntimeError("oops")
    r = check_window_victims(boom)
    assert not r and "RuntimeError: oops" in r.message
    r = check_window_victims(lambda n, nb, bs, s, w: "all")
    assert not r and "list of block indices" in r.message
    r = check_window_victims(lambda n, nb: [])
    assert not r
    assert check_window_victims(victims)


def window_mask(positions, n_ctx, sinks, window):
    j = torch.arange(n_ctx)
    p = positions[:, None]
    return (j[None] <= p) & ((j[None] < sinks) | (p - j[None] < window))


def test_window_mask_passes_and_names_the_mistakes():
    assert check_window_mask(window_mask)
    j = torch.arange
    no_causal = check_window_mask(lambda p, n, s, w: (j(n)[None] < s) | (p[:, None] - j(n)[None] < w))
    assert not no_causal and "causal" in no_causal.message
    wide = check_window_mask(lambda p, n, s, w: (j(n)[None] <= p[:, None])
                             & ((j(n)[None] < s) | (p[:, None] - j(n)[None] <= w)))
    assert not wide and "the query included" in wide.message
    no_sinks = check_window_mask(lambda p, n, s, w: (j(n)[None] <= p[:, None]) & (p[:, None] - j(n)[None] < w))
    assert not no_sinks and "sink" in no_sinks.message
    shape = check_window_mask(lambda p, n, s, w: torch.ones(n, dtype=torch.bool))
    assert not shape and "shape" in shape.message
