"""The CUDA kernels on a real GPU, with torch CUDA tensors passed through __cuda_array_interface__ (no
copies), against torch on the same device. Marked `gpu`; skipped, with the reason, where numba finds
no GPU (always in CI). Run on a GPU machine: `PYTHONPATH=. pytest -m gpu tests/test_kernels_gpu.py`."""
import numpy as np
import pytest
import torch
from close import assert_close
from minillm.kernels import gpu_available

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() and gpu_available()), reason="needs a CUDA GPU")]

# float32 on the GPU: torch may use TF32 or another summation order; 1e-4 relative covers sums of <= 1024
# products, and a layout bug is off by O(1).
TOL = dict(atol=1e-4, rtol=1e-4)


def test_matmul_and_gemv_on_torch_cuda_tensors():
    from minillm.kernels.matmul import gemv_cuda, matmul_cuda
    torch.backends.cuda.matmul.allow_tf32 = False
    x, w = torch.randn(77, 288, device="cuda"), torch.randn(131, 288, device="cuda")
    y = matmul_cuda(x, w)
    assert y.is_cuda and y.shape == (77, 131)
    assert_close(y.cpu(), (x @ w.T).cpu(), **TOL, name="matmul_cuda")
    assert_close(gemv_cuda(w, x[0]).cpu(), (w @ x[0]).cpu(), **TOL, name="gemv_cuda")


def test_rmsnorm_rope_softmax_swiglu():
    from minillm.kernels.rmsnorm import add_rmsnorm_cuda, rmsnorm_cuda
    from minillm.kernels.softmax import online_softmax_cuda, softmax_cuda
    from minillm.kernels.swiglu import swiglu_cuda
    x, wt = torch.randn(64, 288, device="cuda"), torch.randn(288, device="cuda")
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * wt
    assert_close(rmsnorm_cuda(x, wt).cpu(), ref.cpu(), **TOL, name="rmsnorm_cuda")
    res = torch.randn(64, 288, device="cuda")
    want_res = res + x
    out = add_rmsnorm_cuda(x, res, wt)
    assert_close(res.cpu(), want_res.cpu(), **TOL, name="residual")
    assert_close(out.cpu(), (want_res * torch.rsqrt(want_res.pow(2).mean(-1, keepdim=True) + 1e-5) * wt).cpu(), **TOL)
    s = torch.randn(16, 32000, device="cuda")
    for f in (softmax_cuda, online_softmax_cuda):
        assert_close(f(s).cpu(), s.softmax(-1).cpu(), atol=1e-7, rtol=1e-4, name=f.__name__)
    g, u = torch.randn(64, 768, device="cuda"), torch.randn(64, 768, device="cuda")
    assert_close(swiglu_cuda(g, u).cpu(), (torch.nn.functional.silu(g) * u).cpu(), **TOL, name="swiglu_cuda")


def test_attention_kernels_equal_torch():
    from minillm.kernels.flash_attention import flash_attention_cuda
    from minillm.kernels.paged_attention import flash_decoding_cuda, paged_attention_cuda

    from minillm.llama.attention import AttentionMetadata, paged_attention
    T, H, Hkv, D = 200, 8, 2, 64
    q, k, v = (torch.randn(T, H, D, device="cuda"), torch.randn(T, Hkv, D, device="cuda"),
               torch.randn(T, Hkv, D, device="cuda"))
    mask = torch.ones(T, T, dtype=torch.bool, device="cuda").tril()
    want = torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                                            v.transpose(0, 1)[None], attn_mask=mask, enable_gqa=True)
    assert_close(flash_attention_cuda(q, k, v).cpu(), want[0].transpose(0, 1).cpu(), **TOL, name="flash_attention_cuda")
    BS, R = 16, 5
    ctx = torch.tensor([1, 17, 300, 64, 1000])
    M = int(-(-ctx.max() // BS))
    NB = R * M + 3
    tables = torch.randperm(NB)[:R * M].view(R, M)
    k_pool, v_pool = torch.randn(NB, BS, Hkv, D, device="cuda"), torch.randn(NB, BS, Hkv, D, device="cuda")
    qd = torch.randn(R, H, D, device="cuda")
    attn = AttentionMetadata.build((ctx - 1)[:, None], tables, ctx, BS)
    ref = paged_attention(qd[:, None].cpu(), k_pool.cpu(), v_pool.cpu(), attn)[:, 0]
    tc, cc = tables.cuda(), ctx.cuda()
    assert_close(paged_attention_cuda(qd, k_pool, v_pool, tc, cc).cpu(), ref, **TOL, name="paged_attention_cuda")
    assert_close(flash_decoding_cuda(qd, k_pool, v_pool, tc, cc, 8).cpu(), ref, **TOL, name="flash_decoding_cuda")


def test_quantized_gemv():
    from minillm.kernels.quant_gemv import int4_gemv_cuda, int8_gemv_cuda, quantize_int4, quantize_int8
    w = np.random.default_rng(0).standard_normal((300, 256), dtype=np.float32)
    x = torch.randn(256, device="cuda")
    q8, s8, _ = quantize_int8(w)
    want8 = (torch.tensor(q8, dtype=torch.float32) * torch.tensor(s8)[:, None]) @ x.cpu()
    got8 = int8_gemv_cuda(x, torch.tensor(q8, device="cuda"), torch.tensor(s8, device="cuda"))
    assert_close(torch.as_tensor(got8).cpu().reshape(-1), want8, **TOL, name="int8_gemv_cuda")
    p4, s4, _ = quantize_int4(w, 32)
    got4 = int4_gemv_cuda(x, torch.tensor(p4, device="cuda"), torch.tensor(s4, device="cuda"), 32)
    lo, hi = (p4 & 15).astype(np.int64) - 8, (p4 >> 4).astype(np.int64) - 8
    q = np.stack([lo, hi], -1).reshape(300, 256) * np.repeat(s4, 32, axis=1)
    assert_close(torch.as_tensor(got4).cpu().reshape(-1), torch.tensor(q, dtype=torch.float32) @ x.cpu(), **TOL,
                 name="int4")
