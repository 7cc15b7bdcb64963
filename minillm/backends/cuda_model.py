"""The cuda backend: the transformer forward as a sequence of minillm.kernels' CUDA kernel launches.

`CudaTransformer(model)` is a drop-in for `Transformer` in the engine, like the numba backend, but every
step is a kernel launch on torch tensors that live on the GPU: the launchers pass them to numba through
__cuda_array_interface__, so nothing is copied between torch and numba. The KV pool lives on the GPU
too (the engine allocates it there). Per layer:

    rmsnorm -> matmul (q|k|v) -> rope (q, k) -> K/V to their slots -> paged attention -> matmul (o)
    -> fused residual-add + rmsnorm -> matmul (w1|w3) -> swiglu -> matmul (w2) -> fused add + rmsnorm

The same code runs in numba's CUDA simulator on CPU tensors (minillm.kernels.use_simulator()), which is
how CI tests it, on a model small enough for simulated threads. Weights are float32.
"""
from __future__ import annotations

import torch
import torch.nn as nn

from ..kernels import gpu_available, simulating
from ..kernels.matmul import matmul_cuda
from ..kernels.paged_attention import paged_attention_cuda
from ..kernels.rmsnorm import add_rmsnorm_cuda, rmsnorm_cuda
from ..kernels.rope import rope_cuda
from ..kernels.swiglu import swiglu_cuda
from ..llama.transformer import Transformer


def cuda_device() -> torch.device:
    """Where backend='cuda' keeps weights and the KV pool: the GPU, or the CPU under the simulator."""
    if simulating():
        return torch.device("cpu")
    if not (gpu_available() and torch.cuda.is_available()):
        raise ValueError("backend='cuda' needs a CUDA GPU that numba and torch can both use; without one, "
                         "call minillm.kernels.use_simulator() first (slow: tiny models only) or use backend='numba'")
    return torch.device("cuda")


class CudaTransformer(nn.Module):
    def __init__(self, model: Transformer):
        super().__init__()
        dtype = next(model.parameters()).dtype
        if dtype != torch.float32:
            raise ValueError(f"backend='cuda' runs float32 weights, got {dtype}; use dtype='float32'")
        self.model, self.config, self.device = model, model.config, cuda_device()

        def on(t):
            return t.detach().to(self.device, torch.float32).contiguous()
        self.layers = [dict(att_norm=on(b.attention_norm.weight), ffn_norm=on(b.ffn_norm.weight),
                            wqkv=on(torch.cat([b.attention.wq.weight, b.attention.wk.weight, b.attention.wv.weight])),
                            wo=on(b.attention.wo.weight),
                            w13=on(torch.cat([b.feed_forward.w1.weight, b.feed_forward.w3.weight])),
                            w2=on(b.feed_forward.w2.weight)) for b in model.layers]
        self.emb, self.norm, self.wcls = on(model.tok_embeddings.weight), on(model.norm.weight), on(model.output.weight)
        self.cos, self.sin = on(model.rope_cos), on(model.rope_sin)                 # (S, D/2) float32

    def forward(self, tokens, positions, kv=None, attn=None, rows=None, return_hidden: bool = False):
        """The serving interface of Transformer.forward: tokens, positions (B, T) -> logits (N, V) on the CPU at the
        flat token indices `rows` (default: each row's last token). No hidden states, no tree mask (as numba)."""
        if kv is None or attn is None:
            raise ValueError("backend='cuda' serves from the KV cache: pass kv and AttentionMetadata")
        if return_hidden or attn.tree_mask is not None:
            raise ValueError("backend='cuda' computes no hidden states and no tree attention "
                             "(see minillm.backends.capabilities)")
        cfg, dev = self.config, self.device
        B, T = tokens.shape
        if int(positions.max()) >= cfg.max_seq_len:
            raise ValueError(f"position {int(positions.max())} is beyond the model's context "
                             f"max_seq_len={cfg.max_seq_len}")
        H, Hkv, D, eps = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.norm_eps
        HD, KVD, R = H * D, Hkv * D, B * T
        pos = positions.reshape(-1).to(dev).contiguous()                            # (R,)
        slots = attn.slot_mapping.reshape(-1).to(dev)                               # (R,)
        keep = slots >= 0
        tables = attn.block_tables.repeat_interleave(T, 0).to(dev).contiguous()     # (R, M) each row's sequence's
        ctx = pos + 1                                                               # (R,) row r sees 0..pos[r]
        x = self.emb[tokens.reshape(-1).to(dev)].contiguous()                       # (R, C) the residual stream
        xb = rmsnorm_cuda(x, self.layers[0]["att_norm"], eps)                       # (R, C)
        for li, w in enumerate(self.layers):
            qkv = matmul_cuda(xb, w["wqkv"])                                        # (R, HD + 2 KVD)
            q = rope_cuda(qkv[:, :HD].contiguous().view(R, H, D), pos, self.cos, self.sin)        # (R, H, D)
            k = rope_cuda(qkv[:, HD:HD + KVD].contiguous().view(R, Hkv, D), pos, self.cos, self.sin)  # (R, Hkv, D)
            v = qkv[:, HD + KVD:].reshape(R, Hkv, D)                                # (R, Hkv, D)
            kv.k[li].view(-1, Hkv, D)[slots[keep]] = k[keep]                        # K/V to their slots
            kv.v[li].view(-1, Hkv, D)[slots[keep]] = v[keep]
            att = paged_attention_cuda(q, kv.k[li], kv.v[li], tables, ctx)          # (R, H, D)
            out = matmul_cuda(att.reshape(R, HD), w["wo"])                          # (R, C)
            xb = add_rmsnorm_cuda(out, x, w["ffn_norm"], eps)                       # x += attention; xb = norm(x)
            h13 = matmul_cuda(xb, w["w13"])                                         # (R, 2F)
            F = h13.shape[1] // 2
            h = swiglu_cuda(h13[:, :F].contiguous(), h13[:, F:].contiguous())       # (R, F)
            out = matmul_cuda(h, w["w2"])                                           # (R, C)
            nxt = self.layers[li + 1]["att_norm"] if li + 1 < len(self.layers) else self.norm
            xb = add_rmsnorm_cuda(out, x, nxt, eps)                                 # x += mlp; next norm
        last = torch.arange(B) * T + T - 1 if rows is None else torch.as_tensor(rows)  # (N,) rows wanted
        logits = matmul_cuda(xb[last.to(dev)].contiguous(), self.wcls)              # (N, V)
        return logits.cpu()                                                         # (N, V)
