"""Peak table, device-name matching, dtype spellings and device detection."""

from __future__ import annotations

import logging
import sys
import types

import pytest

from babysitter import hardware as hw
from babysitter.hardware import _detect

# Real device-name strings and the row each must map to (None: no row, no guess). Where a spelling is
# confirmed in public output, the source is noted; the others follow the vendors' naming patterns.
REAL_NAMES: list[tuple[str, str | None]] = [
    ("NVIDIA H100 80GB HBM3", "H100 SXM"),  # nvidia-smi on HGX H100
    ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA H100 NVL", "H100 NVL"),  # fastfetch-cli/fastfetch#1658, akash-network/provider-configs#91
    ("NVIDIA H200", "H200 SXM"),  # nvidia-smi -q "Product Name", NVIDIA/mig-parted#120
    ("NVIDIA H200 NVL", "H200 NVL"),
    ("NVIDIA GH200 480GB", "GH200"),  # must not match H200
    ("NVIDIA A100-SXM4-80GB", "A100 SXM"),
    ("NVIDIA A100-SXM4-40GB", "A100 SXM"),
    ("NVIDIA A100-PCIE-40GB", "A100 PCIe"),
    ("NVIDIA A100 80GB PCIe", "A100 PCIe"),
    ("NVIDIA L4", "L4"),
    ("NVIDIA L40S", "L40S"),  # must not match L4 (Lightning's substring test does)
    ("NVIDIA L40", "L40"),
    ("NVIDIA A10G", "A10G"),
    ("NVIDIA A10", "A10"),
    ("NVIDIA B200", "B200"),
    ("NVIDIA GB200", "GB200"),  # must not match B200
    ("NVIDIA B300 SXM6 AC", "B300"),  # nvidia-smi on HGX B300 (public logs and RunPod's GPU list)
    ("NVIDIA GB300", "GB300"),  # must not match B300
    ("AMD Instinct MI355X", "MI355X"),  # rocm-smi product name
    ("AMD Instinct MI350X", "MI350X"),
    ("AMD Instinct MI300X", "MI300X"),
    ("AMD Instinct MI300X OAM", "MI300X"),  # rocm-smi product name pattern
    ("AMD Instinct MI250X", "MI250X"),
    ("AMD Instinct MI325X", "MI325X"),
    ("TPU v4", "TPU v4"),  # JAX device_kind spellings (jax Pallas tests)
    ("TPU v5 lite", "TPU v5e"),
    ("TPU v5", "TPU v5p"),
    ("TPU v6 lite", "TPU v6e"),
    ("v5litepod-16", "TPU v5e"),  # TPU VM ACCELERATOR_TYPE
    ("v5p-128", "TPU v5p"),
    ("v6e-8", "TPU v6e"),
    ("v4-8", "TPU v4"),
    ("Tesla V100-SXM2-16GB", "V100 SXM"),
    ("Tesla V100-PCIE-32GB", "V100 PCIe"),
    ("NVIDIA GeForce RTX 4090", None),
    ("TPU v4 lite", None),  # v4i, a different chip
    ("NVIDIA H100", None),  # variant unknown, peaks differ by 30%
    ("AMD Instinct MI250X / MI250", None),  # one ROCm spelling for two parts with different peaks
    ("AMD Instinct MI300A", None),
    # The China-market parts (issue 22): H800 and A800 as NVML and torch.cuda.get_device_name spell
    # them in public logs and vendor docs (NVIDIA's vGPU supported-GPU list names "NVIDIA H800 PCIe").
    ("NVIDIA H800", "H800 SXM"),
    ("NVIDIA H800 80GB HBM3", "H800 SXM"),
    ("NVIDIA H800 PCIe", "H800 PCIe"),
    ("NVIDIA H20", "H20"),
    ("NVIDIA A800-SXM4-80GB", "A800 SXM"),
    ("NVIDIA A800-SXM4-40GB", "A800 SXM"),
    ("NVIDIA A800 80GB PCIe", "A800 PCIe"),
    ("NVIDIA A800 40GB Active", "A800 PCIe"),
    ("NVIDIA L20", "L20"),
    ("NVIDIA H20A", None),  # not the H20's row without a source for it
    ("Intel(R) Data Center GPU Max 1550", None),
    ("", None),
]


@pytest.fixture(autouse=True)
def _fresh_warnings() -> None:
    hw._warned.clear()


class TestNames:
    @pytest.mark.parametrize(("name", "row"), REAL_NAMES)
    def test_real_name_maps_to_row(self, name: str, row: str | None) -> None:
        """Each real device-name string maps to its row, or to none (never to a neighbour's row)."""
        assert hw.canonical_device(name).device == row

    def test_enough_real_names(self) -> None:
        """The acceptance bar: at least 15 real spellings checked."""
        assert len(REAL_NAMES) >= 15

    @pytest.mark.parametrize("row", list(hw.PEAK_TABLE))
    def test_row_names_are_accepted_as_overrides(self, row: str) -> None:
        """Every canonical row name (what users pass as an override) maps to itself, in any case."""
        assert hw.canonical_device(row).device == row
        assert hw.canonical_device(row.upper()).device == row

    def test_ambiguous_name_says_why(self) -> None:
        """A refused name carries the reason, so the warning tells the user what to pass."""
        assert "SXM" in hw.canonical_device("NVIDIA H100").reason


class TestTable:
    def test_required_rows_present(self) -> None:
        """Every device the issue lists has a row, TPUs included."""
        rows = set(hw.PEAK_TABLE)
        required = {
            "A100 SXM", "A100 PCIe", "H100 SXM", "H100 PCIe", "H100 NVL", "H200 SXM", "H200 NVL",
            "B200", "GB200", "L4", "L40S", "A10", "A10G", "MI250X", "MI300X", "MI325X",
            "B300", "GB300", "MI350X", "MI355X",
            "H800 SXM", "H800 PCIe", "A800 SXM", "A800 PCIe", "H20", "L20",
            "TPU v4", "TPU v5e", "TPU v5p", "TPU v6e",
        }  # fmt: skip
        assert required <= rows

    @pytest.mark.parametrize("row", list(hw.PEAK_TABLE.values()), ids=lambda r: r.device)
    def test_every_row_cites_a_source_and_known_dtypes(self, row: hw.PeakRow) -> None:
        """Every row has a source and only table dtypes with positive peaks."""
        assert len(row.source) > 20
        assert row.peaks
        assert set(row.peaks) <= set(hw.DTYPES)
        assert all(v > 0 for v in row.peaks.values())

    @pytest.mark.parametrize("row", list(hw.PEAK_TABLE.values()), ids=lambda r: r.device)
    def test_dense_ordering(self, row: hw.PeakRow) -> None:
        """Sanity of dense figures: fp32 <= tf32 <= bf16 == fp16 <= fp8 where present."""
        p = row.peaks
        if "fp32" in p and "tf32" in p:
            assert p["fp32"] <= p["tf32"]
        if "tf32" in p and "bf16" in p:
            assert p["tf32"] < p["bf16"]
        if "bf16" in p and "fp16" in p:
            assert p["bf16"] == p["fp16"]
        if "fp8" in p:
            # 2% slack: the L40S datasheet prints 733 TF fp8 beside 362.05 TF bf16.
            assert p["fp8"] == pytest.approx(2 * p["bf16"], rel=0.02)

    @pytest.mark.parametrize(
        ("name", "dtype", "tflops"),
        [
            # Dense datasheet figures (sparse / 2), cross-checked against torchtitan's and Lightning's tables.
            ("NVIDIA H100 80GB HBM3", "bf16", 989.5),
            ("NVIDIA H100 PCIe", "bf16", 756),
            ("NVIDIA H100 80GB HBM3", "fp8", 1979),
            ("NVIDIA A100-SXM4-80GB", "bf16", 312),
            ("NVIDIA A100-SXM4-80GB", "tf32", 156),
            ("NVIDIA L40S", "bf16", 362.05),
            ("NVIDIA L4", "bf16", 121),
            ("NVIDIA B200", "bf16", 2250),
            ("NVIDIA GB200", "bf16", 2500),
            ("AMD Instinct MI250X", "bf16", 191.5),
            ("AMD Instinct MI300X", "bf16", 1307.4),
            # Blackwell Ultra: HGX B300 36 PF bf16 sparse / 8 / 2; GB300 NVL72 720 PF fp8 sparse / 72 / 2.
            ("NVIDIA B300 SXM6 AC", "bf16", 2250),
            ("NVIDIA B300 SXM6 AC", "fp8", 4500),
            ("NVIDIA B300 SXM6 AC", "tf32", 1125),
            ("NVIDIA GB300", "bf16", 2500),
            ("NVIDIA GB300", "fp8", 5000),
            # CDNA 4: 256 CUs x 4,096 (bf16) / 8,192 (fp8) / 256 (fp32) FLOPs per clock x 2.4 / 2.2 GHz.
            ("AMD Instinct MI355X", "bf16", 2516.5824),
            ("AMD Instinct MI355X", "fp8", 5033.1648),
            ("AMD Instinct MI355X", "fp32", 157.2864),
            ("AMD Instinct MI350X", "bf16", 2306.8672),
            ("AMD Instinct MI350X", "fp8", 4613.7344),
            # H800/A800: the H100's/A100's silicon and datasheet figures; H20 and L20: dense in their briefs.
            ("NVIDIA H800", "bf16", 989.5),
            ("NVIDIA H800", "fp8", 1979),
            ("NVIDIA H800 PCIe", "bf16", 756),
            ("NVIDIA A800-SXM4-80GB", "bf16", 312),
            ("NVIDIA A800 80GB PCIe", "tf32", 156),
            ("NVIDIA H20", "bf16", 148),
            ("NVIDIA H20", "fp8", 296),
            ("NVIDIA H20", "tf32", 74),
            ("NVIDIA L20", "bf16", 119.5),
            ("NVIDIA L20", "fp8", 239),
            ("TPU v5 lite", "bf16", 197),
            ("TPU v5", "bf16", 459),
            ("TPU v6 lite", "bf16", 918),
        ],
    )
    def test_known_dense_peaks(self, name: str, dtype: str, tflops: float) -> None:
        """Spot checks against published dense numbers, not the sparse headline figures."""
        entry = hw.lookup_peak(name, dtype)
        assert entry is not None
        assert entry.flops_per_second == pytest.approx(tflops * 1e12)

    @pytest.mark.parametrize(
        ("device", "dtype", "rounded_tflops", "digits"),
        [
            # AMD's product page rounds: MI355X 2.5 PF fp16/bf16, 5 PF fp8 (10.1 sparse), 157.3 TF fp32
            # matrix; MI350X 2.3 PF, 4.6 PF, 144.2 TF. The rows' exact products must round to them.
            ("MI355X", "bf16", 2500, -2),
            ("MI355X", "fp8", 5000, -3),
            ("MI355X", "fp32", 157.3, 1),
            ("MI350X", "bf16", 2300, -2),
            ("MI350X", "fp8", 4600, -2),
            ("MI350X", "fp32", 144.2, 1),
        ],
    )
    def test_cdna4_rows_round_to_amds_figures(
        self, device: str, dtype: str, rounded_tflops: float, digits: int
    ) -> None:
        """The exact CDNA 4 figures (CUs x FLOPs per clock x clock) agree with what AMD prints."""
        assert round(hw.PEAK_TABLE[device].peaks[dtype] / 1e12, digits) == rounded_tflops

    @pytest.mark.parametrize(("device", "dtype"), [("B300", "int8"), ("GB300", "int8"), ("MI355X", "tf32")])
    def test_unsourced_dtypes_of_the_new_rows_are_absent(self, device: str, dtype: str) -> None:
        """Blackwell Ultra's int8 (cut, and the published figures disagree) and CDNA 4's tf32 (none
        listed) give no peak rather than a borrowed one."""
        assert dtype not in hw.PEAK_TABLE[device].peaks
        assert hw.lookup_peak(device, dtype) is None


class TestLookup:
    def test_entry_fields(self) -> None:
        """A hit returns the canonical row, normalized dtype, value and source."""
        entry = hw.lookup_peak("NVIDIA H200", "torch.bfloat16")
        assert entry is not None
        assert (entry.device, entry.dtype) == ("H200 SXM", "bf16")
        assert "H200" in entry.source

    def test_unknown_device_warns_once(self, caplog: pytest.LogCaptureFixture) -> None:
        """Unknown device: None and one warning per (device, dtype), never a fallback row."""
        caplog.set_level(logging.WARNING, logger="babysitter.hardware")
        for _ in range(3):
            assert hw.lookup_peak("NVIDIA GeForce RTX 4090", "bf16") is None
        assert len([r for r in caplog.records if "RTX 4090" in r.getMessage()]) == 1
        assert hw.lookup_peak("NVIDIA GeForce RTX 4090", "fp16") is None
        assert len([r for r in caplog.records if "RTX 4090" in r.getMessage()]) == 2

    def test_missing_dtype_warns(self, caplog: pytest.LogCaptureFixture) -> None:
        """fp8 on an A100 has no peak: None and a warning naming what the device has."""
        caplog.set_level(logging.WARNING, logger="babysitter.hardware")
        assert hw.lookup_peak("NVIDIA A100-SXM4-80GB", "float8_e4m3fn") is None
        assert hw.lookup_peak("TPU v5 lite", "fp32") is None
        messages = [r.getMessage() for r in caplog.records]
        assert any("fp8" in m and "bf16" in m for m in messages)

    def test_bad_dtype_raises(self) -> None:
        """A dtype nobody spells is a setup error, not a silent None."""
        with pytest.raises(ValueError, match="accepted spellings"):
            hw.lookup_peak("NVIDIA H200", "fp12")


class TestDtypes:
    @pytest.mark.parametrize(
        ("spelling", "key"),
        [
            ("bf16", "bf16"),
            ("bfloat16", "bf16"),
            ("torch.bfloat16", "bf16"),
            ("BF16-mixed", "bf16"),
            ("float16", "fp16"),
            ("half", "fp16"),
            ("16-mixed", "fp16"),
            ("float32", "fp32"),
            ("32-true", "fp32"),
            ("tf32", "tf32"),
            ("fp8", "fp8"),
            ("float8_e4m3fn", "fp8"),
            ("torch.float8_e5m2", "fp8"),
            ("int8", "int8"),
        ],
    )
    def test_spellings(self, spelling: str, key: str) -> None:
        """Usual spellings (torch, Lightning, Composer) normalize to one key."""
        assert hw.normalize_dtype(spelling) == key

    def test_torch_dtypes(self) -> None:
        """Real torch dtype objects normalize through str()."""
        torch = pytest.importorskip("torch")
        assert hw.normalize_dtype(torch.bfloat16) == "bf16"
        assert hw.normalize_dtype(torch.float8_e4m3fn) == "fp8"
        assert hw.normalize_dtype(torch.float32) == "fp32"

    @pytest.mark.parametrize("bad", ["float64", "fp4", "int4", "", "bf17"])
    def test_unknown_raises_with_spellings(self, bad: str) -> None:
        """Unknown spellings raise ValueError listing the accepted ones."""
        with pytest.raises(ValueError, match="bfloat16"):
            hw.normalize_dtype(bad)

    def test_matmul_dtype_follows_torch_precision(self) -> None:
        """fp32 counts as tf32 exactly when torch runs fp32 matmuls on TF32 tensor cores."""
        torch = pytest.importorskip("torch")
        before = torch.get_float32_matmul_precision()
        try:
            torch.set_float32_matmul_precision("highest")
            assert hw.matmul_dtype("float32") == "fp32"
            torch.set_float32_matmul_precision("high")
            assert hw.matmul_dtype("float32") == "tf32"
            assert hw.matmul_dtype("bf16") == "bf16"
        finally:
            torch.set_float32_matmul_precision(before)


class FakeNvml:
    """pynvml's function names, return shapes and error type, for a host with given GPU names."""

    class NVMLError(Exception):
        pass

    def __init__(self, names: list[str | bytes], *, init_fails: bool = False) -> None:
        self.names = names
        self.init_fails = init_fails
        self.shutdowns = 0

    def nvmlInit(self) -> None:
        if self.init_fails:
            raise self.NVMLError("Driver Not Loaded")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.names)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        if not 0 <= index < len(self.names):
            raise self.NVMLError("Invalid Argument")
        return index

    def nvmlDeviceGetName(self, handle: int) -> str | bytes:
        return self.names[handle]


class TestDetect:
    def test_nvml_name(self) -> None:
        """NVML's name (str or old-style bytes) is returned, and NVML is shut down again."""
        nvml = FakeNvml(["NVIDIA H200"] * 8)
        assert hw.detect_device_name(nvml=nvml, environ={}) == "NVIDIA H200"
        assert nvml.shutdowns == 1
        assert hw.detect_device_name(nvml=FakeNvml([b"NVIDIA L40S"]), environ={}) == "NVIDIA L40S"

    def test_no_driver_falls_through_to_tpu_env(self) -> None:
        """No NVML driver: the TPU VM's accelerator type is used; with nothing, None."""
        nvml = FakeNvml([], init_fails=True)
        assert hw.detect_device_name(nvml=nvml, environ={"ACCELERATOR_TYPE": "v5litepod-8"}) == "v5litepod-8"
        assert hw.detect_device_name(nvml=nvml, environ={}) is None

    def test_mixed_models_give_none(self, caplog: pytest.LogCaptureFixture) -> None:
        """A host with two GPU models and no torch device chosen: no guess, a warning."""
        caplog.set_level(logging.WARNING)
        nvml = FakeNvml(["NVIDIA A100-SXM4-80GB", "NVIDIA H100 80GB HBM3"])
        assert hw.detect_device_name(nvml=nvml, environ={}) is None
        assert any("different GPU models" in r.getMessage() for r in caplog.records)

    def test_broken_nvml_never_raises(self) -> None:
        """An NVML that raises mid-enumeration is survived."""

        class Broken(FakeNvml):
            def nvmlDeviceGetName(self, handle: int) -> str:
                raise self.NVMLError("GPU is lost")

        assert hw.detect_device_name(nvml=Broken(["x"]), environ={}) is None

    def test_does_not_import_torch(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Detection never imports torch itself: with torch absent from sys.modules it stays absent."""
        monkeypatch.delitem(sys.modules, "torch", raising=False)
        hw.detect_device_name(nvml=FakeNvml([], init_fails=True), environ={})
        assert "torch" not in sys.modules

    def test_torch_initialized_device_wins(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """When torch has initialized CUDA, the rank's own device name is used before NVML."""
        cuda = types.SimpleNamespace(
            is_initialized=lambda: True,
            is_available=lambda: True,
            current_device=lambda: 3,
            get_device_name=lambda i: f"NVIDIA H100 NVL #{i}",
        )
        fake_torch = types.SimpleNamespace(cuda=cuda, version=types.SimpleNamespace(hip=None))
        monkeypatch.setitem(sys.modules, "torch", fake_torch)
        assert _detect.detect_device_name(nvml=FakeNvml(["NVIDIA L4"]), environ={}) == "NVIDIA H100 NVL #3"

    def test_peak_flops_end_to_end(self) -> None:
        """peak_flops with an explicit device name resolves through the table."""
        entry = hw.peak_flops("bf16", device_name="NVIDIA H100 80GB HBM3")
        assert entry is not None
        assert entry.device == "H100 SXM"


class TestDetectOtherStacks:
    def test_rocm_torch_without_nvml(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """On ROCm (no NVML), torch's device name is read even before CUDA/HIP is initialized."""
        cuda = types.SimpleNamespace(
            is_initialized=lambda: False,
            is_available=lambda: True,
            current_device=lambda: 0,
            get_device_name=lambda i: "AMD Instinct MI300X",
        )
        monkeypatch.setitem(
            sys.modules, "torch", types.SimpleNamespace(cuda=cuda, version=types.SimpleNamespace(hip="6.2"))
        )
        nvml = FakeNvml([], init_fails=True)
        assert hw.detect_device_name(nvml=nvml, environ={}) == "AMD Instinct MI300X"

    def test_cuda_torch_not_initialized_is_not_touched(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """On CUDA torch that has not initialized CUDA, detection does not call into it (no CUDA init)."""

        def boom(*_: object) -> str:
            raise AssertionError("must not initialize CUDA")

        cuda = types.SimpleNamespace(
            is_initialized=lambda: False, is_available=boom, current_device=boom, get_device_name=boom
        )
        monkeypatch.setitem(
            sys.modules, "torch", types.SimpleNamespace(cuda=cuda, version=types.SimpleNamespace(hip=None))
        )
        assert hw.detect_device_name(nvml=FakeNvml(["NVIDIA L4"]), environ={}) == "NVIDIA L4"

    def test_jax_device_kind(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """With jax imported on a TPU VM, its device kind names the chip."""
        device = types.SimpleNamespace(platform="tpu", device_kind="TPU v5 lite")
        monkeypatch.setitem(sys.modules, "jax", types.SimpleNamespace(devices=lambda: [device]))
        monkeypatch.delitem(sys.modules, "torch", raising=False)
        name = hw.detect_device_name(nvml=FakeNvml([], init_fails=True), environ={})
        assert name == "TPU v5 lite"
        assert hw.canonical_device(name).device == "TPU v5e"


class TestNewcomerMistakes:
    """Issue 22: a typo in a device name or a dtype says what was meant."""

    def test_a_device_typo_warns_once_with_did_you_mean(self, caplog: pytest.LogCaptureFixture) -> None:
        """No MFU (never a guessed peak), and one warning naming the closest rows and spellings."""
        caplog.set_level(logging.WARNING)
        assert hw.lookup_peak("H10 SXM", "bf16") is None
        assert hw.lookup_peak("H10 SXM", "bf16") is None
        said = [r.getMessage() for r in caplog.records if "H10 SXM" in r.getMessage()]
        assert len(said) == 1 and "did you mean 'H100 SXM'" in said[0], said

    @pytest.mark.parametrize(
        ("typo", "meant"),
        [
            ("NVIDIA H100 80GB HMB3", "NVIDIA H100 80GB HBM3"),
            ("NVIDIA H80", "NVIDIA H800"),
            ("nvidia h2O", "NVIDIA H20"),
            ("NVIDIA L2O", "NVIDIA L20"),
            ("A800-SXM", "A800 SXM"),
        ],
    )
    def test_did_you_mean_puts_the_meant_device_first(self, typo: str, meant: str) -> None:
        assert hw.did_you_mean(typo)[0] == meant

    def test_an_ambiguous_name_is_offered_its_own_variants(self) -> None:
        """A bare "NVIDIA H100" is offered the H100's variants, not a neighbour (H200, H800)."""
        offered = hw.did_you_mean("NVIDIA H100")
        assert offered and all("H100" in name for name in offered), offered

    def test_nothing_close_offers_nothing(self) -> None:
        assert hw.did_you_mean("NVIDIA GeForce RTX 4090") == []

    def test_a_dtype_typo_is_one_clear_error_at_watch(self) -> None:
        """A ValueError raised from watch() itself (no frames of the resolution behind it), with the
        closest spelling, not a list of 36."""
        import babysitter

        with pytest.raises(ValueError, match=r"unknown training dtype 'bf61': did you mean 'bf16'") as info:
            babysitter.watch(port=-1, dtype="bf61", peak_flops=1e12)
        assert len(str(info.value)) < 300
        frames = []
        tb = info.value.__traceback__
        while tb is not None:
            frames.append(tb.tb_frame.f_code.co_name)
            tb = tb.tb_next
        assert frames[-1] == "watch", frames


@pytest.mark.parametrize(
    ("reported", "row", "bf16_tflops"),
    [("NVIDIA H800", "H800 SXM", 989.5), ("NVIDIA A800-SXM4-80GB", "A800 SXM", 312),
     ("NVIDIA H20", "H20", 148), ("NVIDIA L20", "L20", 119.5)],
)  # fmt: skip
def test_a_user_on_a_china_market_gpu_gets_mfu(
    reported: str, row: str, bf16_tflops: float, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The device name the driver reports (detection faked: no GPU here) selects the row, and the
    tracker reports MFU against its dense bf16 peak."""
    import babysitter

    monkeypatch.setattr(hw, "detect_device_name", lambda: reported)
    tracker = babysitter.watch(port=-1, dtype="bf16", flops_per_token=6e9, tokens_per_step=4096)
    try:
        assert tracker.config.peak.device == row
        assert tracker.config.peak.flops_per_second == pytest.approx(bf16_tflops * 1e12)
        for _ in range(5):
            tracker.step()
        snap = tracker.snapshot()
        assert snap.mfu is not None and snap.tokens_per_second
        assert snap.mfu == pytest.approx(snap.tokens_per_second * 6e9 / (bf16_tflops * 1e12))
    finally:
        tracker.close()
