"""What a GPU would show, computed, never measured: the roofline of a few GPUs from their published datasheets.

On a CPU the notebooks measure the CPU. Where a technique pays differently on a GPU, they compute what the GPU's
roofline allows (Williams, Waterman & Patterson, CACM 2009), time >= max(bytes / bandwidth, flops / peak), from
the vendor's published numbers, and label it as computed: a lower bound a real kernel approaches but never beats,
printed beside the measurements, never mixed into them. On a machine with a GPU the notebooks measure it instead.

Datasheet numbers (NVIDIA's product pages): HBM or GDDR bandwidth in bytes/s; dense tensor-core FP16/BF16 FLOP/s
(the 2x "with sparsity" figures are not used); FP32 FLOP/s on the CUDA cores (no tensor cores).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class GPU:
    name: str
    bandwidth: float           # bytes/s of device memory (HBM or GDDR)
    fp16_flop_s: float         # dense FP16/BF16 tensor-core FLOP/s
    fp32_flop_s: float         # FP32 FLOP/s without tensor cores
    memory: float              # bytes of device memory

    def peak(self, dtype: str) -> float:
        """FLOP/s for "fp16" (also bf16: tensor cores) or "fp32"."""
        if dtype in ("fp16", "bf16"):
            return self.fp16_flop_s
        if dtype == "fp32":
            return self.fp32_flop_s
        raise ValueError(f"dtype must be 'fp16', 'bf16' or 'fp32', got {dtype!r}")

    def ridge(self, dtype: str = "fp16") -> float:
        """Flops per byte where the roofline turns: below it a kernel is memory-bound."""
        return self.peak(dtype) / self.bandwidth

    def seconds(self, flops: float, nbytes: float, dtype: str = "fp16") -> float:
        """The roofline's lower bound on a kernel's time: max(bytes / bandwidth, flops / peak)."""
        if flops < 0 or nbytes < 0:
            raise ValueError(f"flops and bytes must be >= 0, got {flops} and {nbytes}")
        return max(nbytes / self.bandwidth, flops / self.peak(dtype))

    def label(self) -> str:
        """How a computed number says where it came from."""
        return (f"computed for an {self.name} from its datasheet ({self.bandwidth / 1e12:.2f} TB/s, "
                f"{self.fp16_flop_s / 1e12:.0f} TFLOP/s fp16): a roofline bound, not a measurement")


PUBLISHED = {
    "H100 SXM": GPU("H100 SXM", 3.35e12, 989e12, 67e12, 80e9),
    "A100 SXM": GPU("A100 SXM", 2.039e12, 312e12, 19.5e12, 80e9),
    "L4": GPU("L4", 300e9, 121e12, 30.3e12, 24e9),
    "T4": GPU("T4", 320e9, 65e12, 8.1e12, 16e9),     # the free tier of hosted notebooks
}


def published(name: str = "H100 SXM") -> GPU:
    """A GPU of PUBLISHED by name."""
    if name not in PUBLISHED:
        raise ValueError(f"unknown GPU {name!r}; published: {', '.join(PUBLISHED)}")
    return PUBLISHED[name]
