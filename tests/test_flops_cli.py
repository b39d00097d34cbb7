"""``babysitter flops CONFIG.json``: what it prints for real configs, and its errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from babysitter.cli import main

CONFIGS = Path(__file__).parent / "data" / "configs"


def run_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, object]:
    assert main(["flops", *args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, dict)
    return data


def test_llama_json_hand_computed(capsys: pytest.CaptureFixture[str]) -> None:
    """Llama-2-7B at 4096 tokens: 6 x 6,607,077,376 matmul weights + 12·32·32·128·4096 = 46,084,915,200
    FLOPs per token; 40% MFU on 8 H100 SXM (989.5 TF) needs 68,708 tokens/s, 61.0 s per 4M-token step."""
    r = run_json(
        capsys,
        str(CONFIGS / "llama-2-7b.json"),
        "--seq-len=4096",
        "--batch-tokens=4194304",
        "--device=NVIDIA H100 80GB HBM3",
        "--devices=8",
        "--target-mfu=0.4",
    )
    flops = r["flops_per_token"]
    assert isinstance(flops, dict)
    assert flops["model"] == 46_084_915_200
    assert r["parameters"] == {
        "total": 6_738_415_616,
        "active": 6_738_415_616,
        "embedding": 131_072_000,
        "non_embedding": 6_607_343_616,
        "active_non_embedding": 6_607_343_616,
    }
    need = r["tokens_per_second_for_mfu"]
    assert isinstance(need, dict)
    assert need["0.4"]["per_device"] == pytest.approx(8588.4936, rel=1e-6)
    assert need["0.4"]["job"] == pytest.approx(68707.949, rel=1e-6)
    steps = r["step_seconds_for_mfu"]
    assert isinstance(steps, dict)
    assert steps["0.4"] == pytest.approx(61.0454, rel=1e-5)
    assert r["device"]["row"] == "H100 SXM"  # type: ignore[index]


def test_mixtral_reports_active(capsys: pytest.CaptureFixture[str]) -> None:
    """The MoE report shows 46.7B total and 12.9B active parameters."""
    r = run_json(capsys, str(CONFIGS / "mixtral-8x7b.json"), "--seq-len=4096")
    params = r["parameters"]
    assert isinstance(params, dict)
    assert round(params["total"] / 1e9, 1) == 46.7
    assert round(params["active"] / 1e9, 1) == 12.9


def test_text_output(capsys: pytest.CaptureFixture[str]) -> None:
    """The human output names parameters, FLOPs and the throughput per MFU target."""
    code = main(
        ["flops", str(CONFIGS / "t5-base.json"), "--seq-len=128", "--encoder-seq-len=512", "--device=A100"]
    )
    out = capsys.readouterr().out
    assert code == 0
    assert "total 222.9M" in out
    assert "MFU 40%" in out
    assert "A100 SXM bf16 312 TFLOP/s" in out


def test_without_seq_len_says_which_flag(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 32: no --seq-len exited 0 without FLOPs. Now an error that names the flag, with an
    example using the config's own context length, and no Python argument (peak_flops=)."""
    assert main(["flops", str(CONFIGS / "gpt2.json")]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert "--seq-len" in err and "--seq-len 1024 (its n_positions is 1024)" in err, err
    assert "seq_len=" not in err and "peak_flops=" not in err, "no Python keyword argument suggested"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--seq-len=128", "--device=NVIDIA GeForce RTX 4090"], "no dense bf16 peak"),
        (["--seq-len=128", "--device=NVIDIA A100-SXM4-80GB", "--dtype=fp8"], "no dense fp8 peak"),
        (["--seq-len=128", "--device=H100 SXM", "--dtype=fp4"], "accepted spellings"),
        (["--seq-len=0"], "--seq-len must be positive"),
    ],
)
def test_errors_exit_1(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    """Unknown device, missing dtype row, bad dtype and bad numbers: exit 1 with a message."""
    assert main(["flops", str(CONFIGS / "gpt2.json"), *args]) == 1
    assert message in capsys.readouterr().err


def test_bad_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Missing file, bad JSON and unsupported model types are clean errors."""
    assert main(["flops", str(tmp_path / "missing.json")]) == 1
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    assert main(["flops", str(bad)]) == 1
    mamba = tmp_path / "mamba.json"
    mamba.write_text('{"model_type": "mamba"}')
    assert main(["flops", str(mamba), "--seq-len=8"]) == 1
    assert "supported" in capsys.readouterr().err
