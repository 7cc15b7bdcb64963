"""The shipped models: they load by name, reach the model card's numbers, and write real text."""
import json
import os

import pytest
import torch

from minillm import LLM, SamplingParams, load
from minillm.formats.llama2c import read_header
from minillm.formats.loader import MODELS_DIR
from minillm.spec_decode.acceptance import measure_acceptance
from minillm.training.train import evaluate

CARD = json.load(open(os.path.join(MODELS_DIR, "card.json")))


def test_files_are_small_and_shaped_as_the_issue_says():
    sizes = {os.path.relpath(os.path.join(d, f), MODELS_DIR): os.path.getsize(os.path.join(d, f))
             for d, _, files in os.walk(MODELS_DIR) for f in files}
    extra = {f: b for f, b in sizes.items() if f.startswith(("shakespeare-moe", "lora" + os.sep))}
    base = sum(sizes.values()) - sum(extra.values())
    assert base < 40 * 2**20, f"the models, tokenizer and card are {base / 2**20:.1f} MiB"
    # the MoE and LoRA issue's allowance on top: under 10 MB of experts, under 1 MB per adapter (their own tests);
    # DESIGN.md: tens of MB at most in total
    assert sum(sizes.values()) < 50 * 2**20, f"shipped files are {sum(sizes.values()) / 2**20:.1f} MiB"
    t = read_header(os.path.join(MODELS_DIR, "shakespeare.bin"))
    assert (t.dim, t.n_layers, t.n_heads, t.n_kv_heads, t.hidden_dim, t.max_seq_len) == (256, 8, 4, 2, 768, 1024)
    d = read_header(os.path.join(MODELS_DIR, "shakespeare-draft.bin"))
    assert d.vocab_size == t.vocab_size and d.flops_per_token() <= 0.1 * t.flops_per_token()


def test_target_reaches_the_card_loss_on_the_held_out_slice():
    model, tok = load("shakespeare")
    ids = torch.tensor(tok.encode(open(os.path.join(MODELS_DIR, "val_slice.txt")).read()))
    n = (len(ids) - 1) // 256
    loss = evaluate(model, ids[: n * 256].view(n, 256), ids[1: n * 256 + 1].view(n, 256))
    # same text, same windows, same float32 model: only summation order can differ (1e-3 nats is ~100x that)
    assert loss == pytest.approx(CARD["val_slice"]["target_loss"], abs=1e-3)
    assert CARD["unigram_val_loss"] - CARD["models"]["shakespeare"]["val_loss"] >= 1.0  # the issue's bar


PROMPTS = ["ROMEO.\nBut soft, what light", "To be, or not to be", "KING.\nNow", "The quality of mercy"]


def distinct(ids):
    return len(set(ids)) / len(ids)


def test_greedy_text_is_not_degenerate():
    llm = LLM("shakespeare")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=120, ignore_eos=True))
    for out in outs:
        # A degenerate model repeats a short cycle from the start: a k-token loop scores k/120 distinct
        # (0.03 for a 4-token loop). A 7M-parameter model decoded greedily does fall into a repeated
        # line after some dozens of tokens (measured: 0.24-0.35 on these prompts), so the stated bound
        # is 0.2: no cycle shorter than 24 tokens, and mostly letters, not punctuation or newlines.
        assert distinct(out.token_ids) > 0.2, out.text
        assert sum(c.isalpha() for c in out.text) > 0.5 * len(out.text)


def test_sampled_text_reads_like_prose():
    llm = LLM("shakespeare")
    outs = llm.generate(PROMPTS, SamplingParams(temperature=0.8, top_p=0.95, max_tokens=120, ignore_eos=True, seed=0))
    # how text is usually generated; English prose of 120 BPE tokens is ~0.6 distinct (measured here:
    # 0.51-0.66 with seed 0). Bound: 0.45 on every prompt.
    assert all(distinct(o.token_ids) > 0.45 for o in outs), [o.text for o in outs]


def test_drafts_load_by_name_and_the_distilled_one_agrees_with_the_target_more():
    target, tok = load("shakespeare")
    draft, tok2 = load("shakespeare-draft")
    scratch, _ = load("shakespeare-draft-scratch")
    assert tok2.pieces == tok.pieces
    ids = torch.tensor(tok.encode(open(os.path.join(MODELS_DIR, "val_slice.txt")).read())[:8 * 128]).view(8, 128)
    a_kd, a_scratch = measure_acceptance(target, draft, ids), measure_acceptance(target, scratch, ids)
    # the card measured 16,384 positions of the whole val split; this slice is 1,024 of them, so only
    # the order is asserted here, plus a loose band (0.1) around the card's value for the distilled draft
    assert a_kd.alpha > a_scratch.alpha and a_kd.alpha_greedy >= a_scratch.alpha_greedy
    assert abs(a_kd.alpha - CARD["models"]["shakespeare-draft"]["alpha"]) < 0.1
