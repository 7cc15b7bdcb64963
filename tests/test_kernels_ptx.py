"""Every CUDA kernel compiles to PTX for sm_80 and sm_90 without a GPU, from the signatures kept beside
it, and ptxas assembles the PTX. Runs in the plain test process (never under the simulator, which has
no compiler); needs numba-cuda with NVVM (the dev extra installs nvidia-nvvm and nvidia-cuda-nvrtc 13.0)."""
import glob
import importlib
import os
import shutil
import subprocess

import minillm.kernels as K
import pytest

TOOLS = {"access_trace"}   # modules of kernels/ that look at kernels (in the simulator) and define none
CPU_ONLY = {"quant_rows", "quant_rows_tiles", "quant_rows_int8", "quant_rows_int4", "quant_rows_q80", "quant_rows_w8a8",
            "quant_rows_kv_int8", "vec8"}  # the numba backend's CPU matmuls (CUDA twins: quant_gemv), vector loops
FAMILIES = sorted(os.path.basename(p)[:-3] for p in glob.glob(os.path.join(os.path.dirname(K.__file__), "*.py"))
                  if not os.path.basename(p).startswith("_") and os.path.basename(p)[:-3] not in TOOLS | CPU_ONLY)
for f in FAMILIES:
    importlib.import_module(f"minillm.kernels.{f}")      # registers its kernels in K.KERNELS
PTXAS = shutil.which("ptxas") or next(iter(glob.glob("/usr/local/cuda*/bin/ptxas")), None)


def test_every_family_has_cuda_kernels():
    assert "matmul" in FAMILIES
    for f in FAMILIES:
        assert any(name.startswith(f"minillm.kernels.{f}.") for name in K.KERNELS), f"{f}.py defines no CUDA kernel"


@pytest.mark.parametrize("cc", [(8, 0), (9, 0)], ids=["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(K.KERNELS))
def test_kernel_compiles_to_ptx_and_assembles(name, cc, tmp_path):
    if K.simulating():
        pytest.skip("the CUDA simulator is on in this process: it has no compiler (run without NUMBA_ENABLE_CUDASIM)")
    ptxs = K.KERNELS[name].compile_ptx(cc)
    arch = f"sm_{cc[0]}{cc[1]}"
    for i, ptx in enumerate(ptxs):
        assert f".target {arch}" in ptx and ".entry" in ptx
        if PTXAS is None:
            pytest.skip("ptxas not found (install the CUDA toolkit to assemble the PTX); compiling to PTX passed")
        src = tmp_path / f"k{i}.ptx"
        src.write_text(ptx)
        done = subprocess.run([PTXAS, f"-arch={arch}", str(src), "-o", str(tmp_path / f"k{i}.cubin")],
                              capture_output=True, text=True)
        assert done.returncode == 0, f"ptxas rejected {name} for {arch}: {done.stderr[-500:]}"
