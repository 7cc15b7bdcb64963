"""Notebook 01's core exercise (causal grouped-query attention plugged into the torch model): the checker
passes a right answer, fails the common mistakes by name, and survives a function that raises or returns the
wrong shape without leaving the model's attention swapped."""
import math

import pytest
import torch

from minillm.labs import check_attend
from minillm.labs.nb01_model import attention_swapped
from minillm.llama import transformer


def attend(q, k, v, mask=True, group="interleave", scale=True, dim=-1):
    """A student's attention, right by default; each keyword is one common mistake.
    q: (B, T, H, D); k, v: (B, T, Hkv, D) -> (B, T, H, D)"""
    B, T, H, D = q.shape
    rep = H // k.shape[2]
    if group == "interleave":
        k, v = k.repeat_interleave(rep, dim=2), v.repeat_interleave(rep, dim=2)   # (B, T, H, D)
    else:
        k, v = k.repeat(1, 1, rep, 1), v.repeat(1, 1, rep, 1)                     # (B, T, H, D)
    scores = q.transpose(1, 2) @ k.permute(0, 2, 3, 1)                            # (B, H, T, T)
    if scale:
        scores = scores / math.sqrt(D)
    if mask:
        scores = scores.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
    return (torch.softmax(scores, dim=dim) @ v.transpose(1, 2)).transpose(1, 2)   # (B, T, H, D)


def test_right_answers_pass():
    assert check_attend(attend)
    fused = lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(        # noqa: E731
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True).transpose(1, 2)
    assert check_attend(fused)


@pytest.mark.parametrize("mistake,named", [
    (dict(mask=False), "no causal mask"),
    (dict(group="repeat"), "repeat_interleave"),
    (dict(scale=False), "missing scale"),
    (dict(dim=-2), "softmax over the wrong axis"),
])
def test_common_mistakes_fail_by_name(mistake, named):
    result = check_attend(lambda q, k, v: attend(q, k, v, **mistake))
    assert not result and named in result.message, repr(result)
    assert "the model's logits with your attention differ" in result.message   # found in the model, by position
    assert transformer.causal_attention.__module__ == "minillm.llama.transformer"


def test_bad_functions_fail_cleanly_and_leave_nothing_behind():
    original = transformer.causal_attention
    calls = []

    def raises_in_the_model(q, k, v):          # right on its own, raises once plugged into a layer
        calls.append(1)
        if len(calls) > 1:
            raise RuntimeError("boom")
        return attend(q, k, v)

    for bad, why in [(raises_in_the_model, "RuntimeError: boom"),
                     (lambda q, k, v: q.sum(-1), "expected (2, 7, 4, 8)"),
                     (lambda q, k, v: None, "returned NoneType"),
                     (lambda q, k: q, "wrong signature")]:
        result = check_attend(bad)
        assert not result and why in result.message, repr(result)
        assert transformer.causal_attention is original
    assert check_attend(attend)                                  # the next attempt starts clean


def test_attention_swapped_plugs_into_every_layer_and_restores():
    from minillm.formats.loader import random_model
    model, _ = random_model("tiny")
    tokens = torch.arange(9)[None]                               # (1, 9)
    seen = []
    with torch.no_grad():
        want = model(tokens)
        with pytest.raises(ZeroDivisionError), attention_swapped(lambda q, k, v: 1 / 0):
            model(tokens)
        with attention_swapped(lambda q, k, v: seen.append(q.shape) or attend(q, k, v)):
            got = model(tokens)
        assert len(seen) == model.config.n_layers
        assert torch.allclose(got, want, atol=1e-5) and torch.equal(model(tokens), want)
