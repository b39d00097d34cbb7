"""Issue 32: the messages a newcomer trips on each say what to do (one test per message).

Mistyped subcommands and flags get a "did you mean" from the parser they were given to; ambiguous
device names are refused alike, with the rows to pick from; a taken port names the flags that move
it; a Prometheus that does not answer is named, with the flag that points elsewhere.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from babysitter import hardware as hw
from babysitter.cli import main
from promkit import free_port

CONFIG = Path(__file__).resolve().parent / "data" / "configs" / "gpt2.json"


def _usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    with pytest.raises(SystemExit) as exit_:
        main(argv)
    assert exit_.value.code == 2
    return capsys.readouterr().err


def test_a_mistyped_subcommand_is_suggested(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, ["reprot", "/tmp"])
    assert "invalid choice: 'reprot'. Did you mean 'report'?" in err, err


def test_a_mistyped_flag_gets_its_subcommands_usage_and_a_suggestion(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """``report --jsn`` printed the top-level usage and no suggestion."""
    err = _usage_error(capsys, ["report", "--jsn", "/tmp"])
    assert err.startswith("usage: babysitter report "), err
    assert "babysitter report: error: unrecognized arguments: --jsn (did you mean --json?)" in err, err
    assert "COMMAND ..." not in err, "not the top-level usage"


def test_a_nested_subcommands_flag_and_choice(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, ["checkpoint", "verify", "--sizes", "x", "--jsn"])
    assert err.startswith("usage: babysitter checkpoint verify "), err
    assert "unrecognized arguments: --jsn (did you mean --json?)" in err, err
    err = _usage_error(capsys, ["checkpoint", "verfy", "x"])
    assert "Did you mean 'verify'?" in err, err
    err = _usage_error(capsys, ["flops", str(CONFIG), "--seq-len", "8", "--recompute", "ful"])
    assert err.startswith("usage: babysitter flops ") and "Did you mean 'full'?" in err, err


def test_nothing_close_suggests_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    err = _usage_error(capsys, ["report", "--zzzzzz", "/tmp"])
    assert "unrecognized arguments: --zzzzzz\n" in err, err


# ------------------------------------------------------------------------------ device names


@pytest.mark.parametrize(
    ("typed", "rows"),
    [
        ("H100", ("H100 SXM", "H100 PCIe", "H100 NVL")),
        ("H200", ("H200 SXM", "H200 NVL")),
        ("h800", ("H800 SXM", "H800 PCIe")),
    ],
)
def test_a_bare_model_is_refused_alike_with_its_rows(
    typed: str, rows: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--device H100`` was refused while ``H200`` became the SXM part (989.5 TF, not the NVL's
    835.5): every bare model whose variants differ in peak is refused, listing them with their peaks,
    and the message names CLI flags, not Python arguments."""
    assert hw.canonical_device(typed).device is None
    assert hw.canonical_device(typed).choices == rows
    assert main(["flops", str(CONFIG), "--seq-len", "1024", "--device", typed]) == 1
    err = capsys.readouterr().err
    assert "not in the name; their peaks differ" in err
    for row in rows:
        peak = hw.PEAK_TABLE[row].peaks["bf16"] / 1e12
        assert f"'{row}' ({peak:g} TFLOP/s bf16)" in err, err
    assert "--device" in err and "peak_flops=" not in err


def test_the_names_the_hardware_reports_still_resolve_and_say_which_part(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """NVML and torch name the H200 SXM "NVIDIA H200": that resolves, and the output says it is the
    SXM part (the NVL card's name says NVL)."""
    assert hw.canonical_device("NVIDIA H200").device == "H200 SXM"
    assert hw.canonical_device("NVIDIA H800").device == "H800 SXM"
    assert hw.canonical_device("H200 NVL").device == "H200 NVL"
    assert main(["flops", str(CONFIG), "--seq-len", "1024", "--device", "NVIDIA H200"]) == 0
    out = capsys.readouterr().out
    assert "peak: H200 SXM bf16 989.5 TFLOP/s" in out
    assert "'NVIDIA H200' is how NVML and torch name the H200 SXM" in out, out


def test_the_library_warning_lists_the_rows_too(caplog: pytest.LogCaptureFixture) -> None:
    """watch(device="H200") gets no MFU (never a guessed variant) and one warning naming the rows."""
    caplog.set_level(logging.WARNING)
    assert hw.lookup_peak("H200", "bf16") is None
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "'H200 SXM' (989.5 TFLOP/s bf16), 'H200 NVL' (835.5 TFLOP/s bf16)" in said, said


def test_a_device_typo_in_the_cli_names_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["flops", str(CONFIG), "--seq-len", "1024", "--device", "H10 SXM"]) == 1
    err = capsys.readouterr().err
    assert "did you mean --device 'H100 SXM'" in err and "peak_flops=" not in err, err


# ------------------------------------------------------------------------------ ports


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield int(sock.getsockname()[1])


def test_a_taken_port_for_the_node_agent_names_the_flags(
    taken_port: int, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    caplog.set_level(logging.ERROR)
    argv = ["node-agent", "--listen-address", f"127.0.0.1:{taken_port}", "--gpu-backend", "none"]
    argv += ["--no-collector.xid", "--no-collector.trainers", "--registry-dir", str(tmp_path)]
    assert main(argv) == 2
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"port {taken_port} is taken by another process" in said, said
    assert "--port 0 --port-file FILE" in said and "--listen-address HOST:PORT" in said


def test_a_taken_port_for_remediate_names_the_flags(
    taken_port: int, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    from babysitter.demo.remediation import remediate_policy
    from babysitter.demo.stack import write_json

    policy = remediate_policy(
        audit_log=tmp_path / "audit.jsonl", prometheus_url="http://127.0.0.1:9", cluster="c"
    )
    path = write_json(tmp_path / "policy.json", policy)
    caplog.set_level(logging.ERROR)
    argv = ["remediate", "--policy", str(path), "--listen-address", f"127.0.0.1:{taken_port}"]
    assert main([*argv, "--insecure-no-auth"]) == 2
    said = " ".join(r.getMessage() for r in caplog.records)
    assert f"port {taken_port} is taken" in said and "HOST:0 with --port-file FILE" in said, said


# ------------------------------------------------------------------------------ Prometheus


def test_explain_against_a_dead_prometheus_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    """It gave "connection refused" and nothing else: now which URL, that nothing answers there, and
    the flag that points elsewhere."""
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["explain", "--prometheus", url, "--run", "r", "--timeout", "2"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"babysitter explain: {url}: Connection refused: nothing listens there"), err
    assert "is Prometheus running at that address and port?" in err
    assert "point at the right one with --prometheus URL" in err


def test_scorecard_against_a_dead_prometheus_says_what_to_do(capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["scorecard", "--prometheus", url, "--timeout", "2"]) == 2
    assert "point at the right one with --prometheus URL" in capsys.readouterr().err
