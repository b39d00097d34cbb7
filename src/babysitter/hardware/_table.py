"""Dense peak FLOP/s per device model and dtype, every row citing where its numbers come from.

Numbers are DENSE (no 2:4 structured sparsity): vendors print the sparse figure first, twice the
dense one, and quoting it halves everyone's MFU (karpathy/nanoGPT#464, NVIDIA/Megatron-LM#1276).
Where a datasheet gives only the starred sparse figure, the row stores half of it. A dtype a chip
has no tensor-core path for (fp8 before Hopper, tf32 on MI250X, fp32 on TPUs) is absent, and a lookup
for it gives no peak rather than a borrowed one. "Per device" means what one training rank drives:
one GPU, one MI250X GCD (the OAM holds two), one TPU chip.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

__all__ = ["PEAK_TABLE", "PeakRow"]

T = 1e12
P = 1e15


@dataclass(frozen=True)
class PeakRow:
    """One device model: its canonical name, dense peaks by dtype key, and the source of the numbers."""

    device: str
    peaks: Mapping[str, float] = field(repr=False)
    source: str


def _row(device: str, source: str, **peaks: float) -> PeakRow:
    return PeakRow(device=device, peaks=MappingProxyType(dict(peaks)), source=source)


_NV_A100 = (
    "NVIDIA A100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/a100/, "
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf): SXM and PCIe columns are identical"
)
_NV_H100 = (
    "NVIDIA H100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h100/), "
    "dense = half of the starred sparse figures"
)
_NV_H200 = (
    "NVIDIA H200 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/h200/), "
    "dense = half of the starred sparse figures"
)
_AMD_MI300 = (
    "AMD Instinct MI300X / MI325X datasheets (amd.com/en/products/accelerators/instinct/mi300/), "
    "dense figures; MI325X has the MI300X's compute with more memory"
)
_NV_GH200 = (
    "NVIDIA GH200 Grace Hopper Superchip datasheet (nvidia.com/en-us/data-center/grace-hopper-superchip/):"
    " the Hopper GPU of an H100 SXM, same tensor-core peaks"
)
_NV_B200 = (
    "NVIDIA HGX B200 / DGX B200 datasheets (nvidia.com/en-us/data-center/hgx/): 8-GPU figures / 8,"
    " sparse / 2; torchtitan's table: bf16 2.25 PF"
)
_NV_GB200 = (
    "NVIDIA GB200 NVL72 specifications (nvidia.com/en-us/data-center/gb200-nvl72/): 72-GPU figures / 72,"
    " sparse / 2; torchtitan's table: bf16 2.5 PF"
)
# Blackwell Ultra. NVIDIA prints system figures with sparsity; per GPU dense = / GPUs / 2. INT8 is left
# out: Blackwell Ultra cut it (HGX B300: 2 POPS sparse for 8 GPUs, against 72 for HGX B200) and the
# published per-GPU figures disagree, so a lookup says "no int8 peak" rather than pick one.
_NV_B300 = (
    "NVIDIA HGX B300 specifications (nvidia.com/en-us/data-center/hgx/; the table as reproduced at "
    "fibermall.com/blog/?p=17161): FP16/BF16 36 PF, FP8 72 PF, TF32 18 PF sparse and FP32 600 TF for "
    "8 GPUs, / 8, sparse / 2; per-GPU dense figures agree in verda.com/blog/gb300-nvl72-architecture "
    "and glennklockwood.com/garden/processors/B300"
)
_NV_GB300 = (
    "NVIDIA GB300 NVL72 specifications (nvidia.com/en-us/data-center/gb300-nvl72/): FP8/FP6 720 PF sparse "
    "for 72 GPUs (as summarised at vendordeep.com/report/nvidia-launches-blackwell-ultra-gb300), / 72, "
    "sparse / 2; per-GPU dense table (bf16 2.5 PF, tf32 1.25 PF, fp32 80 TF) in "
    "verda.com/blog/gb300-nvl72-architecture"
)
# CDNA 4 (gfx950): 256 CUs, 4,096 dense FP16/BF16 and 8,192 FP8 FLOPs per CU per clock (twice CDNA 3's,
# AMD at ISSCC 2026: world-today-news.com/?p=7253162), 256 FP32 matrix FLOPs; at the peak engine clock
# (MI355X 2.4 GHz, MI350X 2.2 GHz) this gives AMD's rounded 2.5 / 2.3 PF bf16 and 5.0 / 4.6 PF fp8.
# No tf32 entry: AMD lists no TF32 matrix rate for CDNA 4. No int8 entry: not checked against a source.
_AMD_MI350 = (
    "AMD Instinct MI350 series specifications (amd.com/en/products/accelerators/instinct/mi350.html), "
    "dense; exact figures from 256 CUs x FLOPs per CU per clock x peak clock (2.4 GHz MI355X, 2.2 GHz "
    "MI350X, wccftech.com Hot Chips 2025 report); MI355X bf16 2.52 PF dense, 5.03 PF sparse as in "
    "gangliao.me/blog/2026/amd-gpu-architecture-deep-dive"
)
_NV_L4 = "NVIDIA L4 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/l4/), dense = half of starred"
_NV_A10 = "NVIDIA A10 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/products/a10-gpu/), dense"
# NVIDIA publishes no A10G datasheet (an AWS-only part). Lightning and Composer reuse the A10's 125 TF,
# but a measured bf16 matmul reaches 69.5 TF (zzc0721/torch-performance-test-data#126), which fits the
# ~70 TF Baseten's comparison gives; the A10 row would understate A10G MFU by about 1.8x.
_A10G = (
    "Baseten, 'NVIDIA A10 vs A10G for ML model inference' (baseten.co/blog/nvidia-a10-vs-a10g-for-ml-"
    "model-inference/); no NVIDIA datasheet exists; consistent with a measured 69.5 TF bf16 matmul"
)
# One MI250X OAM is two GCDs, each a separate device to ROCm, torch and rocm-smi and a separate rank:
# the per-OAM figures (383 TF bf16, 95.7 TF fp32 matrix) are halved.
_AMD_MI250X = (
    "AMD Instinct MI250X specifications (amd.com/en/products/accelerators/instinct/mi200/mi250x.html):"
    " per-OAM peaks / 2 GCDs; torchtitan's table: 191.5 TF per GCD"
)
# The export parts sold in China. H800 and A800 are the H100 and A100 silicon with NVLink cut to 400 GB/s
# (and the H800's FP64 to 1 TF): NVIDIA's H800 and A800 datasheets print the H100's and A100's tensor-core
# figures, sparse (starred), so the dense peaks are the same rows' numbers. H20 (78 SMs of GH100) and L20
# (92 SMs of AD102) are cut-down parts: their product briefs print dense figures, which the SM counts
# confirm (Hopper: 1,024 dense FP16 FLOPs per SM per clock, 78 x 1,024 x 1.85 GHz = 148 TF; Ada: 512,
# the L40's 181.05 TF / 142 SMs / 2.49 GHz, and 92 x 512 x 2.54 GHz = 119.6 TF).
_NV_H800 = (
    "NVIDIA H800 Tensor Core GPU datasheet (the copy at chaoqing-i.com/upload/20231128/NVIDIA%20H800%20GPU"
    "%20Datasheet.pdf, cited for the H800 beside nvidia.com's H100 page in public peak tables): SXM "
    "1,979 TF bf16/fp16, 3,958 TF fp8, 989 TF tf32 with sparsity, PCIe 1,513 / 3,026 / 756 (a public "
    "H800 PCIe FP8 GEMM benchmark quotes the same 3,026 TF peak), the H100's figures; dense = half of "
    "the starred sparse figures; fp32 67 TF (SXM) and 51 TF (PCIe), not starred"
)
_NV_A800 = (
    "NVIDIA A800 datasheets (A800 40GB/80GB PCIe and SXM4; A800 40GB Active): the A100's figures, "
    "19.5 TF fp32, 156 TF tf32, 312 TF bf16/fp16, 624 TOPS int8 dense (312 / 624 / 624 / 1,248 with "
    "sparsity; OEM listings of the A800 PCIe 40 GB print 155.94 / 311.87 TF dense, 1.41 GHz boost)"
)
_NV_H20 = (
    "NVIDIA H20 product brief (China-market HGX H20, 96 GB HBM3), dense figures: fp32 44 TF, tf32 74 TF, "
    "bf16/fp16 148 TF, fp8 148 x 2 = 296 TF, int8 296 TOPS (as reproduced in Chinese trade press: "
    "'FP16 稠密算力 148 TFLOPS', i.e. dense); 78 SMs x 1,024 dense FP16 FLOPs/clock x 1.85 GHz = 148 TF"
)
_NV_L20 = (
    "NVIDIA L20 product brief (China-market Ada part, 48 GB GDDR6, 92 SMs, 2.52 GHz boost), dense: "
    "fp32 59.8 TF, tf32 59.8 TF, bf16/fp16 119.5 TF, fp8 and int8 239 (sparse: twice); the L40's dense "
    "per-SM rate (181.05 TF / 142 SMs / 2.49 GHz = 512 FLOPs/clock) x 92 SMs x 2.54 GHz = 119.6 TF"
)
_TPU = "Google Cloud TPU documentation, 'Peak compute per chip' (cloud.google.com/tpu/docs/{v})"

PEAK_TABLE: Mapping[str, PeakRow] = MappingProxyType(
    {
        row.device: row
        for row in (
            _row("A100 SXM", _NV_A100, fp32=19.5 * T, tf32=156 * T, bf16=312 * T, fp16=312 * T, int8=624 * T),
            _row(
                "A100 PCIe", _NV_A100, fp32=19.5 * T, tf32=156 * T, bf16=312 * T, fp16=312 * T, int8=624 * T
            ),
            _row("A800 SXM", _NV_A800, fp32=19.5 * T, tf32=156 * T, bf16=312 * T, fp16=312 * T, int8=624 * T),
            _row(
                "A800 PCIe", _NV_A800, fp32=19.5 * T, tf32=156 * T, bf16=312 * T, fp16=312 * T, int8=624 * T
            ),
            _row(
                "H100 SXM",
                _NV_H100,
                fp32=67 * T,
                tf32=494.5 * T,
                bf16=989.5 * T,
                fp16=989.5 * T,
                fp8=1979 * T,
                int8=1979 * T,
            ),
            _row(
                "H100 PCIe",
                _NV_H100,
                fp32=51 * T,
                tf32=378 * T,
                bf16=756 * T,
                fp16=756 * T,
                fp8=1513 * T,
                int8=1513 * T,
            ),
            _row(
                "H100 NVL",
                _NV_H100 + " (NVL column, per GPU; Lightning's table: bf16 835.5 TF)",
                fp32=60 * T,
                tf32=417.5 * T,
                bf16=835.5 * T,
                fp16=835.5 * T,
                fp8=1670.5 * T,
                int8=1670.5 * T,
            ),
            _row(
                "H800 SXM",
                _NV_H800 + " (SXM column)",
                fp32=67 * T,
                tf32=494.5 * T,
                bf16=989.5 * T,
                fp16=989.5 * T,
                fp8=1979 * T,
                int8=1979 * T,
            ),
            _row(
                "H800 PCIe",
                _NV_H800 + " (PCIe column)",
                fp32=51 * T,
                tf32=378 * T,
                bf16=756 * T,
                fp16=756 * T,
                fp8=1513 * T,
                int8=1513 * T,
            ),
            _row(
                "H20",
                _NV_H20,
                fp32=44 * T,
                tf32=74 * T,
                bf16=148 * T,
                fp16=148 * T,
                fp8=296 * T,
                int8=296 * T,
            ),
            _row(
                "GH200",
                _NV_GH200,
                fp32=67 * T,
                tf32=494.5 * T,
                bf16=989.5 * T,
                fp16=989.5 * T,
                fp8=1979 * T,
                int8=1979 * T,
            ),
            _row(
                "H200 SXM",
                _NV_H200 + " (SXM column)",
                fp32=67 * T,
                tf32=494.5 * T,
                bf16=989.5 * T,
                fp16=989.5 * T,
                fp8=1979 * T,
                int8=1979 * T,
            ),
            _row(
                "H200 NVL",
                _NV_H200 + " (NVL column: 1,671 TF bf16 sparse; Lightning rounds to 840 TF dense)",
                fp32=60 * T,
                tf32=417.5 * T,
                bf16=835.5 * T,
                fp16=835.5 * T,
                fp8=1670.5 * T,
                int8=1670.5 * T,
            ),
            _row(
                "B200",
                _NV_B200,
                fp32=75 * T,
                tf32=1.125 * P,
                bf16=2.25 * P,
                fp16=2.25 * P,
                fp8=4.5 * P,
                int8=4.5 * P,
            ),
            _row(
                "GB200",
                _NV_GB200,
                fp32=80 * T,
                tf32=1.25 * P,
                bf16=2.5 * P,
                fp16=2.5 * P,
                fp8=5 * P,
                int8=5 * P,
            ),
            _row(
                "B300",
                _NV_B300,
                fp32=75 * T,
                tf32=1.125 * P,
                bf16=2.25 * P,
                fp16=2.25 * P,
                fp8=4.5 * P,
            ),
            _row(
                "GB300",
                _NV_GB300,
                fp32=80 * T,
                tf32=1.25 * P,
                bf16=2.5 * P,
                fp16=2.5 * P,
                fp8=5 * P,
            ),
            _row(
                "L4",
                _NV_L4,
                fp32=30.3 * T,
                tf32=60 * T,
                bf16=121 * T,
                fp16=121 * T,
                fp8=242.5 * T,
                int8=242.5 * T,
            ),
            _row(
                "L20",
                _NV_L20,
                fp32=59.8 * T,
                tf32=59.8 * T,
                bf16=119.5 * T,
                fp16=119.5 * T,
                fp8=239 * T,
                int8=239 * T,
            ),
            _row(
                "L40",
                "NVIDIA L40 GPU datasheet (nvidia.com/en-us/data-center/l40/), dense = half of starred",
                fp32=90.5 * T,
                tf32=90.5 * T,
                bf16=181.05 * T,
                fp16=181.05 * T,
                fp8=362 * T,
                int8=362 * T,
            ),
            _row(
                "L40S",
                "NVIDIA L40S GPU datasheet (nvidia.com/en-us/data-center/l40s/), dense column",
                fp32=91.6 * T,
                tf32=183 * T,
                bf16=362.05 * T,
                fp16=362.05 * T,
                fp8=733 * T,
                int8=733 * T,
            ),
            _row(
                "A10",
                _NV_A10,
                fp32=31.2 * T,
                tf32=62.5 * T,
                bf16=125 * T,
                fp16=125 * T,
                int8=250 * T,
            ),
            _row(
                "A10G",
                _A10G,
                fp32=35 * T,
                tf32=35 * T,
                bf16=70 * T,
                fp16=70 * T,
                int8=140 * T,
            ),
            _row(
                "V100 SXM",
                "NVIDIA V100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/v100/), SXM2 column",
                fp32=15.7 * T,
                fp16=125 * T,
            ),
            _row(
                "V100 PCIe",
                "NVIDIA V100 Tensor Core GPU datasheet (nvidia.com/en-us/data-center/v100/), PCIe column",
                fp32=14 * T,
                fp16=112 * T,
            ),
            _row(
                "MI250X",
                _AMD_MI250X,
                fp32=47.85 * T,
                bf16=191.5 * T,
                fp16=191.5 * T,
                int8=191.5 * T,
            ),
            _row(
                "MI300X",
                _AMD_MI300,
                fp32=163.4 * T,
                tf32=653.7 * T,
                bf16=1307.4 * T,
                fp16=1307.4 * T,
                fp8=2614.9 * T,
                int8=2614.9 * T,
            ),
            _row(
                "MI325X",
                _AMD_MI300,
                fp32=163.4 * T,
                tf32=653.7 * T,
                bf16=1307.4 * T,
                fp16=1307.4 * T,
                fp8=2614.9 * T,
                int8=2614.9 * T,
            ),
            _row(
                "MI350X",
                _AMD_MI350,
                fp32=256 * 256 * 2.2e9,
                bf16=256 * 4096 * 2.2e9,
                fp16=256 * 4096 * 2.2e9,
                fp8=256 * 8192 * 2.2e9,
            ),
            _row(
                "MI355X",
                _AMD_MI350,
                fp32=256 * 256 * 2.4e9,
                bf16=256 * 4096 * 2.4e9,
                fp16=256 * 4096 * 2.4e9,
                fp8=256 * 8192 * 2.4e9,
            ),
            _row("TPU v4", _TPU.format(v="v4"), bf16=275 * T, int8=275 * T),
            _row("TPU v5e", _TPU.format(v="v5e"), bf16=197 * T, int8=394 * T),
            _row("TPU v5p", _TPU.format(v="v5p"), bf16=459 * T, int8=918 * T),
            _row("TPU v6e", _TPU.format(v="v6e"), bf16=918 * T, int8=1836 * T),
        )
    }
)
