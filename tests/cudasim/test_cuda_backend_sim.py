"""backend='cuda' in numba's simulator: the forward as CUDA kernel launches equals the torch model, and
the engine serves a batch on it. The model is tiny (dim 16, vocab 300) because every simulated thread
is a Python thread. (The engine's own test of backend='cuda' needs a tokenizer, so a vocabulary of at
least 259 tokens: it decodes one two-token prompt for two tokens.)"""
import pytest
import torch
from close import assert_close

from minillm import LLM, SamplingParams
from minillm.backends.cuda_model import CudaTransformer
from minillm.config import ModelConfig
from minillm.labs.hashmodel import IdTokenizer
from minillm.llama.attention import AttentionMetadata
from minillm.llama.kv_cache import KVCache
from minillm.llama.transformer import Transformer

CFG = ModelConfig(dim=16, hidden_dim=24, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=40, max_seq_len=32)


@pytest.fixture(scope="module")
def micro():
    return Transformer(CFG).init_weights(seed=3, std=0.3).eval()


def test_cuda_forward_equals_torch_through_a_paged_pool(micro):
    prompts = [[1, 5, 9], [1, 37]]
    B, T, bs = 2, 3, 4
    tables = torch.tensor([[5, 2, 7, 0, 1, 3, 4, 6], [8, 9, 10, 11, 12, 13, 14, 15]])   # (B, M), scattered
    tokens, positions = torch.zeros(B, T, dtype=torch.long), torch.zeros(B, T, dtype=torch.long)
    valid = torch.zeros(B, T, dtype=torch.bool)
    for b, p in enumerate(prompts):
        tokens[b, :len(p)], positions[b, :len(p)], valid[b, :len(p)] = torch.tensor(p), torch.arange(len(p)), True
    attn = AttentionMetadata.build(positions, tables, torch.tensor([3, 2]), bs, valid)
    rows = torch.arange(B) * T + torch.tensor([2, 1])                                   # (B,) each prompt's last token
    got, want = [], []
    for net, out in ((CudaTransformer(micro), got), (micro, want)):
        kv = KVCache(CFG, num_blocks=16, block_size=bs)
        with torch.inference_mode():
            out.append(net(tokens, positions, kv, attn, rows=rows))                     # prefill
            step = AttentionMetadata.build(torch.tensor([[3], [2]]), tables, torch.tensor([4, 3]), bs)
            # decode
            out.append(net(torch.tensor([[11], [12]]), torch.tensor([[3], [2]]), kv, step, rows=torch.arange(2)))
    for g, w in zip(got, want):
        # float32, sums of <= 24 products in another order through a layer: 1e-5 is ~100 ulps at |logit| ~ 1
        assert_close(g, w, atol=1e-5, rtol=1e-5, name="cuda backend vs torch")


def test_engine_serves_and_speculates_on_the_cuda_backend():
    """The engine on the kernels, speculating (the model as its own draft, on torch): verification rows are
    ordinary rows for the kernels (each query token attends to positions 0..its own), so the output is plain
    greedy decoding's."""
    cfg = ModelConfig(dim=16, hidden_dim=24, n_layers=1, n_heads=2, n_kv_heads=1, vocab_size=260, max_seq_len=16)
    model, tok = Transformer(cfg).init_weights(seed=4, std=0.3).eval(), IdTokenizer(260)  # no BPE to build
    greedy = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)    # a prefill, then one verification
    prompt = [[1, 5, 6, 5]]
    llm = LLM(model, tokenizer=tok, backend="cuda", block_size=4,
              speculative={"method": "draft", "gamma": 1, "model": model})
    assert llm.engine.kv.k.device == llm.engine.runner.model.device          # the pool where the kernels run
    got = llm.generate(prompt, greedy)[0].token_ids
    assert llm.engine.spec_stats["drafted"] > 0
    assert got == LLM(model, tokenizer=tok, block_size=4).generate(prompt, greedy)[0].token_ids
