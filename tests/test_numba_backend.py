"""backend='numba': the whole forward on minillm.kernels' CPU twins. It equals the torch model within
float32 rounding, prints what run.c prints, and (unlike torch) gives a sequence the same logits bit for
bit whatever else is in its batch (DESIGN rule 7)."""
import pytest
import torch
from close import assert_close

from minillm import LLM, SamplingParams
from minillm.backends.numba_model import NumbaTransformer
from minillm.formats.loader import random_model
from minillm.llama.attention import AttentionMetadata
from minillm.llama.kv_cache import KVCache


@pytest.fixture(scope="module")
def tiny():
    model, tok = random_model("tiny", seed=0)
    model.init_weights(seed=5, std=0.15)
    return model, tok


def prefill(net, cfg, prompts, block_size=4, shuffle=0):
    """Right-padded prefill of `prompts` (lists of ids) into a fresh pool -> logits (B, V) at each last token."""
    B, T = len(prompts), max(map(len, prompts))
    per_seq = -(-cfg.max_seq_len // block_size)
    kv = KVCache(cfg, num_blocks=B * per_seq + shuffle, block_size=block_size)
    blocks = torch.randperm(B * per_seq + shuffle, generator=torch.Generator().manual_seed(shuffle))[:B * per_seq]
    tables = blocks.view(B, per_seq)                                      # (B, M) scattered blocks
    tokens = torch.zeros(B, T, dtype=torch.long)
    positions = torch.zeros(B, T, dtype=torch.long)
    valid = torch.zeros(B, T, dtype=torch.bool)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)], positions[b, :len(p)], valid[b, :len(p)] = torch.tensor(p), torch.arange(len(p)), True
    attn = AttentionMetadata.build(positions, tables, torch.tensor([len(p) for p in prompts]), block_size, valid)
    rows = torch.arange(B) * T + torch.tensor([len(p) - 1 for p in prompts])   # (B,) each prompt's last token
    with torch.inference_mode():
        return net(tokens, positions, kv, attn, rows=rows)


def test_numba_forward_equals_torch(tiny):
    model, _ = tiny
    prompts = [[1, 5, 9, 200, 7, 3, 3, 40], [1, 77], [1, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309]]
    want = prefill(model, model.config, prompts)
    got = prefill(NumbaTransformer(model), model.config, prompts)
    # float32, 2 layers, sums of <= 64 products per dot in a different order: 1e-4 is ~1000 ulps at |logit| ~ 1
    assert_close(got, want, atol=1e-4, rtol=1e-4, name="numba vs torch logits")


def test_a_sequences_logits_do_not_depend_on_its_batch_bit_for_bit(tiny):
    model, _ = tiny
    net = NumbaTransformer(model)
    a = [1, 5, 9, 200, 7, 3, 3, 40]
    alone = prefill(net, model.config, [a])[0]
    for others, shuffle in [([[1, 2]], 3), ([[1] + list(range(10, 40)), [1, 8, 8]], 7)]:
        batched = prefill(net, model.config, [a] + others, shuffle=shuffle)[0]
        assert torch.equal(alone, batched)
    # one row (the kernels' batch-1 path, no parallel region) against the same row among others
    one = prefill(net, model.config, [[1]])[0]
    assert torch.equal(one, prefill(net, model.config, [[1], [7], [300]], shuffle=2)[0])


def test_engine_on_numba_matches_torch_and_is_batch_independent(tiny):
    model, tok = tiny
    prompts = ["To be, or not to be", "Hamlet", "Who's there?"]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    numba = LLM(model, tokenizer=tok, backend="numba", block_size=4)
    together = [o.token_ids for o in numba.generate(prompts, greedy)]
    alone = [numba.generate(p, greedy)[0].token_ids for p in prompts]
    assert together == alone
    # against torch: tokens agree (float32 on both sides; this tiny model's top-2 margins are >> 1e-4)
    assert together == [o.token_ids for o in LLM(model, tokenizer=tok, block_size=4).generate(prompts, greedy)]


def test_the_numba_runner_step_hands_numpy_through_and_tensors_on_demand(tiny):
    """The runner gives the numba forward its numpy index arrays and keeps the numpy logits it returns (`raw`):
    a greedy step makes no torch tensor. `out.logits` (what logprobs, beams and sampling read) are torch views of
    the same values; a direct call with torch tensors still returns torch."""
    import numpy as np
    model, tok = tiny
    e = LLM(model, tokenizer=tok, backend="numba", block_size=4).engine
    e.add_request("Hamlet", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    e.step()
    batch = e.scheduler.schedule(False)
    out = e.runner.run(batch, None)
    assert type(out.raw[0]) is np.ndarray and out.raw[0].shape == (1, model.config.vocab_size)
    assert torch.equal(out.logits[0], torch.from_numpy(out.raw[0]))
    assert e.runner.index_arrays is tuple and type(out.logits[0]) is torch.Tensor


def test_numba_backend_refuses_other_dtypes(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match="backend='numba' does not run dtype='float64' yet; backends that do: torch"):
        LLM(model, tokenizer=tok, backend="numba", dtype="float64")


def test_run_cli_with_numba_prints_what_runc_prints(data_dir, capfdbinary):
    from minillm.__main__ import main
    rc = main(["run", f"{data_dir}/golden.bin", "-z", f"{data_dir}/golden_tok.bin", "--backend", "numba",
               "-t", "0", "-n", "0", "-i", "Hamlet"])
    out, _ = capfdbinary.readouterr()
    assert rc == 0 and out == open(f"{data_dir}/golden_greedy.txt", "rb").read()


@pytest.mark.skipif(__import__("minillm.kernels").kernels.gpu_available(), reason="this machine has a GPU")
def test_cuda_backend_without_a_gpu_says_what_to_do(tiny):
    model, tok = tiny
    with pytest.raises(ValueError, match=r"backend='cuda' needs a CUDA GPU .* minillm.kernels.use_simulator\(\) first"):
        LLM(model, tokenizer=tok, backend="cuda")


def run_rows(net, cfg, calls, block_size=4):
    """Several calls into one pool: each (tokens, first position) is one sequence's new tokens; -> each call's
    logits at every one of its tokens."""
    kv = KVCache(cfg, num_blocks=-(-cfg.max_seq_len // block_size), block_size=block_size)
    table = torch.arange(kv.num_blocks)[None]                                      # (1, M)
    outs = []
    for toks, start in calls:
        n = len(toks)
        positions = torch.arange(start, start + n)[None]                           # (1, n)
        attn = AttentionMetadata.build(positions, table, torch.tensor([start + n]), block_size)
        with torch.inference_mode():
            outs.append(net(torch.tensor([toks]), positions, kv, attn, rows=torch.arange(n)))
    return outs


def test_numba_verification_rows_are_bit_identical_to_plain_decode_rows(tiny):
    """Scoring k + 1 tokens in one call (speculative verification) gives, at each of them, exactly the logits
    that decoding them one by one gives: every row is its own fixed-order sum."""
    model, _ = tiny
    net, x = NumbaTransformer(model), [1, 5, 9, 200, 7, 3, 3, 40, 11, 12]
    plain = run_rows(net, model.config, [(x[:6], 0)] + [([x[i]], i) for i in range(6, 10)])
    spec = run_rows(net, model.config, [(x[:6], 0), (x[6:], 6)])
    assert torch.equal(spec[0], plain[0])
    assert torch.equal(spec[1], torch.cat(plain[1:]))


@pytest.mark.parametrize("options", [dict(speculative={"method": "ngram", "gamma": 3}),
                                     dict(enable_chunked_prefill=True, max_num_batched_tokens=5),
                                     dict(speculative={"method": "draft", "gamma": 2, "model": "random:tiny"})],
                         ids=["ngram", "chunked-prefill", "draft"])
def test_numba_serves_speculation_and_chunked_prefill_with_plain_tokens(tiny, options):
    model, tok = tiny
    prompts = ["To be, or not to be, to be, or not to be", "Hamlet", "Who's there?"]
    greedy = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    plain = [o.token_ids for o in LLM(model, tokenizer=tok, backend="numba", block_size=4).generate(prompts, greedy)]
    llm = LLM(model, tokenizer=tok, backend="numba", block_size=4, **options)
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == plain
    if "speculative" in options:
        assert llm.engine.spec_stats["drafted"] > 0
    else:
        assert any(s.kind == "mixed" and s.num_prefill_tokens < 5 for s in llm.engine.trace.steps)


def test_numba_serves_medusa_trees_with_plain_tokens():
    """Medusa's candidate tree on numba (tree mask, RoPE positions apart from cache slots, hidden states for the
    heads): a tree node's row sees the cached positions and its ancestors in position order, the same keys in
    the same order a plain decode of the accepted path sees, so greedy output equals plain greedy exactly."""
    prompts = ["ROMEO.\n", "HAMLET.\nTo be, or not to be"]
    greedy = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    plain = [o.token_ids for o in LLM("shakespeare", backend="numba").generate(prompts, greedy)]
    llm = LLM("shakespeare", backend="numba", speculative={"method": "medusa", "gamma": 3})
    assert [o.token_ids for o in llm.generate(prompts, greedy)] == plain
    assert llm.engine.spec_stats["accepted"] > 0


@pytest.fixture(scope="module")
def shipped():
    from minillm.formats.loader import load
    return load("shakespeare")


@pytest.mark.parametrize("scheme,atol", [
    ("int8", 1e-4), ("int4", 1e-4), ("w8a8", 1e-4),
    # Q8_0 quantizes each matmul's input too: an input that differs from torch's by float32 rounding (1e-7) can
    # round to the neighbouring int8 step, moving that product by x_scale * |w| ~ 1e-2; a few such flips over 8
    # layers stay well under 0.2 on logits of magnitude ~10 (the kernels alone agree bit for bit: test_quant_rows)
    ("q8_0", 0.2)])
def test_numba_runs_quantized_weights_as_torch_does(shipped, scheme, atol):
    from minillm.quantization.quantize import quantize_model
    model, tok = shipped
    qm, _ = quantize_model(model, scheme, None, tok)
    qm.ensure_rope(model.config.max_seq_len)
    prompts = [[1, 5, 9, 200, 7, 3, 3, 40], [1, 77], [1, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309]]
    want = prefill(qm, qm.config, prompts)
    assert_close(prefill(NumbaTransformer(qm), qm.config, prompts), want, atol=atol, rtol=1e-4,
                 name=f"numba vs torch, {scheme}")


@pytest.mark.parametrize("options", [dict(quantization="int4"), dict(kv_cache_dtype="int8")], ids=["int4", "kv-int8"])
def test_auto_serves_quantized_weights_and_kv_on_numba_with_torchs_tokens(options):
    prompts = ["ROMEO.\n", "HAMLET.\nTo be, or not to be"]
    greedy = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    auto = LLM("shakespeare", **options)
    assert auto.engine.backend == "numba"
    want = [o.token_ids for o in LLM("shakespeare", backend="torch", **options).generate(prompts, greedy)]
    assert [o.token_ids for o in auto.generate(prompts, greedy)] == want


def test_numba_forward_equals_torch_at_a_head_dim_off_the_8_lane_steps():
    """dim 48 over 4 heads: head dim 12, so attention's dot products and value sums run one 8-float step of
    kernels.vec8 plus the 4-float remainder loop (every other model here has D % 8 == 0, and a dropped remainder
    moves these logits by ~1). Prefill, then decode rows one token at a time, against torch within float32
    rounding (1e-4, as test_numba_forward_equals_torch)."""
    model, _ = random_model("tiny", seed=0, dim=48, n_heads=4, n_kv_heads=2)
    model.init_weights(seed=5, std=0.15)
    assert model.config.head_dim == 12
    prompts = [[1, 5, 9, 200, 7, 3, 3, 40], [1, 77], [1, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309]]
    want = prefill(model, model.config, prompts)
    assert_close(prefill(NumbaTransformer(model), model.config, prompts), want, atol=1e-4, rtol=1e-4,
                 name="numba vs torch logits, head dim 12")
    x = [1, 5, 9, 200, 7, 3, 3, 40, 11, 12, 13]
    calls = [(x[:6], 0)] + [([x[i]], i) for i in range(6, len(x))]          # a prefill, then 5 decodes
    for got, ref in zip(run_rows(NumbaTransformer(model), model.config, calls), run_rows(model, model.config, calls)):
        assert_close(got, ref, atol=1e-4, rtol=1e-4, name="numba vs torch decode logits, head dim 12")
