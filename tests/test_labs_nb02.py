"""Notebook 02's core exercise (one decode step with a KV cache, plugged into every layer of the engine's greedy
loop): the checker passes a right answer, fails the common mistakes by name, and survives a function that
raises or returns the wrong shape without leaving the model's layers swapped."""
import math

import pytest
import torch

from minillm.bench import profiling
from minillm.formats.loader import random_model
from minillm.labs import check_cached_attention
from minillm.labs.nb02_kv_cache import decode_step_plugged, time_per_token_with
from minillm.llama.transformer import Attention, apply_rope


def step(q, k, v, k_cache, v_cache, pos, cos, sin, slot=0, keys="written", rope="pos", rotate_q=True, rotate_v=False):
    """A student's decode step, right by default; each keyword is one common mistake.
    q: (H, D); k, v: (Hkv, D); k_cache, v_cache: (S, Hkv, D); cos, sin: (S, D/2) -> (H, D)"""
    at = {"pos": pos, "zero": 0, "next": pos + 1}[rope]
    c, s = cos[at].view(1, 1, -1), sin[at].view(1, 1, -1)                    # (1, 1, D/2)
    if rotate_q:
        q = apply_rope(q[None, None], c, s)[0, 0]                            # (H, D)
    k = apply_rope(k[None, None], c, s)[0, 0]                                # (Hkv, D)
    if rotate_v:
        v = apply_rope(v[None, None], c, s)[0, 0]                            # (Hkv, D)
    w = min(max(pos + slot, 0), k_cache.shape[0] - 1)
    k_cache[w], v_cache[w] = k, v
    n = {"written": pos + 1, "all": k_cache.shape[0]}[keys]
    rep = q.shape[0] // k.shape[0]
    K = k_cache[:n].repeat_interleave(rep, dim=1).transpose(0, 1)            # (H, n, D)
    V = v_cache[:n].repeat_interleave(rep, dim=1).transpose(0, 1)            # (H, n, D)
    p = torch.softmax((K @ q[:, :, None]).squeeze(-1) / math.sqrt(q.shape[-1]), dim=-1)  # (H, n)
    return (p[:, None, :] @ V).squeeze(1)                                    # (H, D)


def test_right_answer_passes():
    assert check_cached_attention(step)


@pytest.mark.parametrize("mistake,named", [
    (dict(slot=1), "off by one"),
    (dict(slot=-1), "off by one"),
    (dict(keys="all"), "attends over unwritten slots"),
    (dict(rope="zero"), "RoPE for position 0 (that is, not rotated at all)"),
    (dict(rope="next"), "RoPE for position"),
    (dict(rotate_q=False), "q is not rotated"),
    (dict(rotate_v=True), "V is cached rotated"),
])
def test_common_mistakes_fail_by_name(mistake, named):
    result = check_cached_attention(lambda *args: step(*args, **mistake))
    assert not result and named in result.message, repr(result)


def test_a_copy_of_the_cache_is_not_a_write():
    result = check_cached_attention(lambda q, k, v, kc, vc, pos, cos, sin: step(q, k, v, kc.clone(), vc.clone(),
                                                                                   pos, cos, sin))
    assert not result and "in place" in result.message, repr(result)


def test_bad_functions_fail_cleanly_and_the_next_attempt_passes():
    for bad, why in [(lambda *args: 1 / 0, "ZeroDivisionError"),
                     (lambda q, *rest: q[None], "expected (4, 8)"),
                     (lambda q, k, v: q, "wrong signature")]:
        result = check_cached_attention(bad)
        assert not result and why in result.message, repr(result)
    assert check_cached_attention(step)


def test_plugged_loop_matches_the_engine_and_restores_the_layers():
    model, _ = random_model("tiny")
    n = 12
    engine = profiling.time_per_token_with_cache(model, n, [1, 5, 9], repeats=1, keep_logits=True)
    calls = []
    mine = time_per_token_with(lambda *args: calls.append(1) or step(*args), model, n, [1, 5, 9])
    assert mine.method == "your cache" and mine.token_ids == engine.token_ids
    assert profiling.greedy_agreement(engine, mine)["max_abs_logit_diff"] < 1e-4
    assert len(calls) == model.config.n_layers * (n - 1 + min(4, n) - 1)   # decode steps of the run and the warm-up
    with pytest.raises(ZeroDivisionError):
        time_per_token_with(lambda *args: 1 / 0, model, 3, [1, 5, 9])
    assert all(type(block.attention) is Attention for block in model.layers)
    with decode_step_plugged(model, step):
        assert not any(type(block.attention) is Attention for block in model.layers)
    assert all(type(block.attention) is Attention for block in model.layers)
