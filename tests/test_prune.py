"""Pruning (minillm.quantization.prune): the masks each pattern keeps, Wanda's score, the bad-input refusals, and
sparsity={...} as a setting of the one engine on the shipped model."""
import math

import pytest
import torch
import torch.nn as nn

from minillm import LLM, SamplingParams
from minillm.bench.quant import held_out_windows, pool_loss
from minillm.config import EngineConfig
from minillm.formats.loader import load
from minillm.llama.linears import Sparse24Linear
from minillm.quantization.calibration import with_outlier_channels
from minillm.quantization.prune import input_norms, prune_mask, prune_model, scores


@pytest.fixture(scope="module")
def shipped():
    model, tok = load("shakespeare")
    return model, tok, input_norms(model, tok)


def test_unstructured_mask_drops_the_lowest_fraction_of_each_row():
    torch.manual_seed(0)
    s = torch.rand(6, 40)
    mask = prune_mask(s, 0.3)
    assert (mask.sum(1) == 40 - 12).all()                                    # floor(0.3 * 40) = 12 per row
    for r in range(6):
        assert s[r][~mask[r]].max() < s[r][mask[r]].min()                   # every dropped score below every kept


@pytest.mark.parametrize("pattern,n,m", [("2:4", 2, 4), ("1:4", 1, 4), ("4:8", 4, 8)])
def test_n_m_mask_keeps_the_n_best_of_every_m(pattern, n, m):
    torch.manual_seed(1)
    s = torch.rand(5, 32)
    g, mg = s.view(5, 32 // m, m), prune_mask(s, pattern).view(5, 32 // m, m)
    assert (mg.sum(-1) == n).all()
    kept_min = torch.where(mg, g, torch.inf).amin(-1)
    dropped_max = torch.where(mg, -torch.inf, g).amax(-1)
    assert (dropped_max < kept_min).all()


def test_wanda_weighs_each_weight_by_its_input_norm():
    """Row [1, 2]: magnitude drops 1; with ||X|| = [10, 1] Wanda's scores are [10, 2] and it drops 2 instead."""
    w = torch.tensor([[1.0, 2.0]])
    assert torch.equal(scores(w, "wanda", torch.tensor([10.0, 1.0])), torch.tensor([[10.0, 2.0]]))
    assert prune_mask(scores(w, "magnitude"), 0.5).tolist() == [[False, True]]
    assert prune_mask(scores(w, "wanda", torch.tensor([10.0, 1.0])), 0.5).tolist() == [[True, False]]


@pytest.mark.parametrize("pattern", [0.0, 1.0, 1.5, -0.2, float("nan"), True, "4:2", "2:2", "0:4", "2:4:8", "a:b",
                                     "50%"])
def test_bad_pattern_is_refused_naming_the_value(pattern):
    with pytest.raises(ValueError, match=r"sparsity pattern.*" + __import__("re").escape(repr(pattern))):
        EngineConfig(sparsity={"method": "wanda", "pattern": pattern})


def test_bad_sparsity_dict_is_refused():
    with pytest.raises(ValueError, match="'sgd'"):
        EngineConfig(sparsity={"method": "sgd", "pattern": 0.5})
    with pytest.raises(ValueError, match="must be None or a dict"):
        EngineConfig(sparsity=0.5)
    with pytest.raises(ValueError, match="must be None or a dict"):
        EngineConfig(sparsity={"method": "wanda", "pattern": 0.5, "blocksize": 8})
    assert EngineConfig(sparsity={"pattern": "2:4"}).sparsity == {"method": "wanda", "pattern": "2:4"}


def test_prune_model_2_4_stores_compressed_layers(shipped):
    model, tok, norms = shipped
    pruned, rep = prune_model(model, {"method": "wanda", "pattern": "2:4"}, tok, norms=norms)
    layers = [m for n, m in pruned.named_modules() if n.startswith("layers.") and hasattr(m, "in_features")]
    assert layers and all(type(m) is Sparse24Linear for m in layers)        # 8 layers x 7 linears
    assert len(layers) == 7 * model.config.n_layers
    assert rep["sparsity"] == 0.5 and rep["compressed"]
    assert abs(rep["linear_bytes"] / rep["linear_bytes_dense"] - (0.5 + 1 / 32)) < 1e-9   # 2K + K/8 of 4K bytes
    assert type(pruned.output) is nn.Linear and type(model.layers[0].attention.wq) is nn.Linear  # caller's untouched
    w = model.layers[0].attention.wq.weight.detach()
    want = w * prune_mask(scores(w, "wanda", norms["layers.0.attention.wq"]), "2:4")
    assert torch.equal(pruned.layers[0].attention.wq.dequantize(), want)


def test_wanda_is_blind_to_a_rescaling_that_misleads_magnitude(shipped):
    """with_outlier_channels: the same function, with 3 input channels scaled up 60x and their weights down 60x
    (what large LLMs grow by themselves). Wanda's score |W| ||X|| does not change, so it keeps the same weights and
    the same perplexity as on the shipped model; magnitude now drops the small weights that read the large inputs,
    and its perplexity rises. (On this model Wanda does not beat magnitude at 50%: see bench sparsity.)"""
    model, tok, norms = shipped
    twin = with_outlier_channels(model)
    twin_norms = input_norms(twin, tok)
    w, wt = model.layers[2].attention.wq.weight, twin.layers[2].attention.wq.weight
    same = prune_mask(scores(w, "wanda", norms["layers.2.attention.wq"]), 0.5) == \
        prune_mask(scores(wt, "wanda", twin_norms["layers.2.attention.wq"]), 0.5)
    assert same.float().mean() > 0.999                                       # float rounding may swap a near tie
    x, y = held_out_windows(tok, max_windows=2)

    def ppl(m, method, n):
        return math.exp(pool_loss(prune_model(m, {"method": method, "pattern": 0.5}, tok, norms=n)[0], x, y))
    # the two Wanda runs differ only where float rounding swapped a near tie: 1e-3 relative is > 10x what we see
    assert abs(ppl(twin, "wanda", twin_norms) / ppl(model, "wanda", norms) - 1) < 1e-3
    cols = [3, 77, 150]                                                      # with_outlier_channels' channels
    kept = {k: prune_mask(scores(m.layers[2].attention.wq.weight, "magnitude"), 0.5)[:, cols].float().mean().item()
            for k, m in (("shipped", model), ("twin", twin))}
    assert kept["shipped"] > 0.3 and kept["twin"] == 0.0                   # magnitude drops the 60x smaller columns


def test_engine_runs_2_4_on_torch_and_matches_the_pruned_dense_model(shipped):
    model, tok, norms = shipped
    sp = {"method": "wanda", "pattern": "2:4"}
    llm = LLM(model, tokenizer=tok, sparsity=sp, max_model_len=64, max_num_seqs=2)
    assert llm.engine.backend == "torch" and "sparsity pattern='2:4'" in llm.engine.backend_choice
    assert llm.engine.parts.sparsity_report["sparsity"] == 0.5
    assert type(llm.engine.model.layers[3].feed_forward.w2) is Sparse24Linear
    dense = prune_model(model, {"method": "wanda", "pattern": "2:4"}, tok, norms=norms)[0]
    for layer in dense.layers:                                                # the same weights, stored dense
        for name, mod in list(layer.attention.named_children()) + list(layer.feed_forward.named_children()):
            if isinstance(mod, Sparse24Linear):
                lin = nn.Linear(mod.in_features, mod.out_features, bias=False)
                with torch.no_grad():
                    lin.weight.copy_(mod.dequantize())
                setattr(layer.attention if hasattr(layer.attention, name) else layer.feed_forward, name, lin)
    ref = LLM(dense, tokenizer=tok, backend="torch", max_model_len=64, max_num_seqs=2)
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    prompts = ["To be, or not", "ROMEO:"]
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
    assert got == [o.outputs[0].token_ids for o in ref.generate(prompts, params)]


def test_unstructured_runs_on_numba_and_2_4_does_not_combine_with_quantization(shipped):
    model, tok, _ = shipped
    llm = LLM(model, tokenizer=tok, sparsity={"method": "magnitude", "pattern": 0.3}, max_model_len=32, max_num_seqs=1)
    assert llm.engine.backend == "numba"                                     # dense weights with zeros
    w = llm.engine.model.layers[0].feed_forward.w1.weight
    assert abs((w == 0).float().mean().item() - 0.3) < 0.01
    with pytest.raises(ValueError, match="does not run sparsity pattern='2:4'"):
        LLM(model, tokenizer=tok, backend="numba", sparsity={"method": "wanda", "pattern": "2:4"})
    with pytest.raises(ValueError, match="quantization='int8'"):
        LLM(model, tokenizer=tok, quantization="int8", sparsity={"method": "wanda", "pattern": "2:4"})
