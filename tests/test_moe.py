"""The MoE layer (minillm.moe.experts): routing, per-expert dispatch against a per-token reference, the upcycling
identity (all experts active, weight 1 each == the dense model), partitions, statistics and the Switch loss."""
import copy

import pytest
import torch

from minillm.formats.loader import random_model
from minillm.moe.experts import (
    MoEConfig,
    MoEFeedForward,
    aux_loss,
    cluster_partition,
    contiguous_partition,
    expert_load,
    ffn_activations,
    load_imbalance,
    moe_layers,
    moe_partitions,
    reset_stats,
    switch_aux_loss,
    upcycle,
)

# float64 throughout the equalities: the MoE sums each token's hidden units in E partial sums instead of one, so
# float32 would differ by rounding (~1e-6); in float64 the same sums agree to ~1e-15 relative, hence 1e-10 below.
TOL64 = 1e-10


@pytest.fixture(scope="module")
def tiny():
    model, tok = random_model("tiny", seed=3)          # dim 64, hidden 192, 2 layers, vocab 512
    return model.double(), tok


def tokens(B=2, T=19, seed=0):
    return torch.randint(0, 512, (B, T), generator=torch.Generator().manual_seed(seed))


def test_top_k_larger_than_experts_is_refused_naming_both():
    with pytest.raises(ValueError, match=r"top_k=5 .* n_experts=4"):
        MoEConfig(n_experts=4, top_k=5, expert_hidden=8)
    with pytest.raises(ValueError, match="partition"):
        MoEConfig(partition="random")


@pytest.mark.parametrize("partition", ["contiguous", "cluster"])
def test_upcycled_with_every_expert_at_weight_one_is_the_dense_model(tiny, partition):
    """top-4 of 4 with a uniform router: renormalised gates 1/4, times gate_scale 4 = 1 each, exactly."""
    dense, _ = tiny
    x = tokens()
    cfg = MoEConfig(n_experts=4, top_k=4, expert_hidden=48, partition=partition)
    moe = upcycle(copy.deepcopy(dense), cfg, moe_partitions(dense, cfg, tokens(4, 32, seed=1)))
    for layer in moe_layers(moe):
        layer.router.weight.data.zero_()
    with torch.no_grad():
        assert torch.allclose(moe(x), dense(x), rtol=0, atol=TOL64)
        assert all(torch.equal(m.last.gates, torch.ones_like(m.last.gates)) for m in moe_layers(moe))


def test_top_2_is_not_the_dense_model(tiny):
    """The identity above must not pass vacuously: with half the experts off the output changes."""
    dense, _ = tiny
    moe = upcycle(copy.deepcopy(dense), MoEConfig(4, 2, 48, partition="contiguous"))
    with torch.no_grad():
        assert (moe(tokens()) - dense(tokens())).abs().max() > 1e-3


def reference_moe(layer: MoEFeedForward, x):
    """Token by token: Mixtral's rule written out (softmax over the top-k logits = renormalised top-k probs)."""
    out = torch.zeros_like(x)
    for n in range(x.shape[0]):
        logits = layer.router(x[n])                                               # (E,)
        top, idx = logits.topk(layer.cfg.top_k)
        g = torch.softmax(top, -1) * layer.cfg.gate_scale                         # (k,)
        for gate, e in zip(g, idx.tolist()):
            h = torch.nn.functional.silu(layer.w1[e] @ x[n]) * (layer.w3[e] @ x[n])  # (He,)
            out[n] += gate * (layer.w2[e] @ h)
    return out


@pytest.mark.parametrize("E,k", [(4, 2), (5, 3), (3, 1)])
def test_dispatch_equals_the_per_token_reference(E, k):
    torch.manual_seed(E * 10 + k)
    layer = MoEFeedForward(24, MoEConfig(E, k, 7)).double()
    for p in layer.parameters():
        p.data.normal_()
    x = torch.randn(3, 11, 24, dtype=torch.float64)
    with torch.no_grad():
        y = layer(x)
        ref = reference_moe(layer, x.reshape(-1, 24)).view(3, 11, 24)
    assert torch.allclose(y, ref, rtol=0, atol=TOL64 * ref.abs().max())
    st = layer.last
    assert st.counts.sum() == 33 * k and st.experts.shape == (33, k) and st.probs.shape == (33, E)
    assert torch.allclose(st.gates.sum(-1), torch.full((33,), float(k), dtype=st.gates.dtype))


def test_statistics_accumulate_and_reset(tiny):
    dense, _ = tiny
    moe = upcycle(copy.deepcopy(dense), MoEConfig(4, 2, 48))
    with torch.no_grad():
        moe(tokens(1, 10))
        moe(tokens(2, 5))
    load = expert_load(moe)                                    # (L, E)
    assert load.shape == (2, 4) and load.sum(1).tolist() == [40, 40]      # (10 + 10 tokens) x k=2, every layer
    reset_stats(moe)
    assert expert_load(moe).sum() == 0 and moe_layers(moe)[0].last is None


def test_switch_loss_is_one_when_balanced_and_E_when_collapsed():
    E = 4
    uniform = torch.full((8, E), 1 / E)
    assert switch_aux_loss(uniform, torch.tensor([4, 4, 4, 4])).item() == pytest.approx(1.0, abs=1e-12)
    collapsed = torch.zeros(8, E)
    collapsed[:, 0] = 1
    assert switch_aux_loss(collapsed, torch.tensor([16, 0, 0, 0])).item() == pytest.approx(E, abs=1e-12)


def test_aux_loss_trains_the_router_and_only_in_training_mode(tiny):
    dense, _ = tiny
    moe = upcycle(copy.deepcopy(dense), MoEConfig(4, 2, 48)).train()
    moe(tokens())
    loss = aux_loss(moe)
    loss.backward()
    assert all(m.router.weight.grad is not None and m.router.weight.grad.abs().sum() > 0 for m in moe_layers(moe))
    moe.eval()
    with torch.no_grad():
        moe(tokens())
    with pytest.raises(ValueError, match="training mode"):
        aux_loss(moe)


def test_partitions_are_partitions_and_clustering_finds_planted_groups():
    p = contiguous_partition(12, 4)
    assert p.tolist() == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9, 10, 11]]
    with pytest.raises(ValueError, match="hidden_dim=10 .* n_experts=4"):
        contiguous_partition(10, 4)
    # 16 units in 4 planted groups: group g fires on tokens g, g+4, g+8, ...; units shuffled
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(16, generator=g)
    h = torch.zeros(64, 16, dtype=torch.float64)
    for unit in range(16):
        group = int(perm[unit]) // 4
        h[group::4, unit] = 1 + torch.rand(16, generator=g, dtype=torch.float64)
    parts = cluster_partition(h, 4, seed=1)
    assert sorted(parts.flatten().tolist()) == list(range(16))
    found = sorted(sorted(int(perm[u]) // 4 for u in row) for row in parts.tolist())
    assert found == [[0] * 4, [1] * 4, [2] * 4, [3] * 4]


def test_upcycle_refuses_a_split_that_does_not_cover_the_hidden_units(tiny):
    dense, _ = tiny
    with pytest.raises(ValueError, match="4 x 40 != 192"):
        upcycle(copy.deepcopy(dense), MoEConfig(4, 2, 40))


def test_ffn_activations_are_the_dense_hidden_units(tiny):
    dense, _ = tiny
    x = tokens(1, 7)
    acts = ffn_activations(dense, x)
    assert len(acts) == 2 and acts[0].shape == (7, 192)
    emb = dense.layers[0].ffn_norm(dense.tok_embeddings(x) + 0)   # layer 0's FFN input needs attention: just shapes
    assert emb.shape == (1, 7, 64)


def test_load_imbalance():
    r = load_imbalance(torch.tensor([[10, 10, 10, 10], [40, 0, 0, 0]]))
    assert r["max_over_mean"] == [1.0, 4.0]
    assert r["cv"][0] == 0.0 and r["cv"][1] == pytest.approx(3 ** 0.5)
    assert r["max_over_mean_avg"] == 2.5
