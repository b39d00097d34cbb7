"""Issue 31.7: nothing a ledger, a label or Prometheus holds reaches the operator's terminal as a
control sequence or as rich markup.

Each attack plants the same payload: a screen clear (``ESC[2J``), a window title (OSC 0), an OSC 8
hyperlink, the 8-bit CSI (``0x9b``), a bidi override (U+202E) and rich markup that would become a
hyperlink (``[link=http://evil]x[/link]``). The output is read twice: piped (no control byte at all
but newline) and as a terminal (``FORCE_COLOR``: only rich's own colour sequences, and no OSC 8).
"""

from __future__ import annotations

import http.server
import json
import re
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from babysitter.cli import main
from babysitter.labels import sanitize_value
from babysitter.terminal import clean

ESC_CLEAR = "\x1b[2J"
OSC_TITLE = "\x1b]0;pwned\x07"
OSC_LINK = "\x1b]8;;http://evil/\x1b\\click\x1b]8;;\x1b\\"
C1_CSI = "\x9b2J"
BIDI = "\u202egnp.exe"
MARKUP = "[link=http://evil]x[/link]"
PAYLOAD = f"{ESC_CLEAR}{OSC_TITLE}{OSC_LINK}{C1_CSI}{BIDI}{MARKUP}"
#: rich's own styling on a terminal: SGR sequences only.
_SGR = re.compile("\x1b\\[[0-9;]*m")
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def assert_clean(text: str, *, terminal: bool) -> None:
    """No control character but newline (tab nowhere either) after rich's colours, no OSC 8."""
    assert "\x1b]8;" not in text, "an OSC 8 hyperlink reached the terminal"
    assert "\x1b]" not in text, "an OSC sequence reached the terminal"
    if terminal:
        text = _SGR.sub("", text)
    found = sorted({f"U+{ord(c):04X}" for c in _CONTROL.findall(text)} | ({"TAB"} if "\t" in text else set()))
    assert not found, f"control characters in the output: {found}"


def _hostile_ledger(run_dir: Path) -> None:
    from babysitter.ledger.records import CheckpointBegin, CheckpointEnd, Start
    from test_ledger_helpers import Book, ramp, s

    run_dir.mkdir()
    book = Book().start(0.0).steps(1, ramp(0.5, 5))
    ckpt = str(run_dir / f"ck{PAYLOAD}")
    book._add(CheckpointBegin(t=s(5.5), op="save", step=5, path=ckpt))
    book._add(CheckpointEnd(t=s(5.6), op="save", step=5, ok=True, nbytes=100, path=ckpt))
    book.end(10.0)
    first = book.records[0]
    assert isinstance(first, Start)
    book.records[0] = Start(
        t=first.t, pst=first.pst, id=first.id, host=f"host{PAYLOAD}", pid=1, run=f"run{PAYLOAD}"
    )
    book.write(run_dir / "babysitter-ledger.jsonl")


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
def test_report_prints_no_escape_from_the_ledger(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, terminal: bool
) -> None:
    """The run name, host and checkpoint path of a ledger on shared storage carry the payload."""
    run_dir = tmp_path / "run"
    _hostile_ledger(run_dir)
    if terminal:
        monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "400")
    assert main(["report", str(run_dir)]) == 0
    out, err = capsys.readouterr()
    assert "host" in out and "run" in out and "step 5" in out, out
    assert "[link=http://evil]x[/link]" in out, "markup is shown as the text it is"
    assert_clean(out + err, terminal=terminal)


def test_report_json_stays_faithful(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--json is escaped by JSON itself: the payload comes back byte for byte, and no raw control
    character is on stdout."""
    run_dir = tmp_path / "run"
    _hostile_ledger(run_dir)
    assert main(["report", str(run_dir), "--json"]) == 0
    out = capsys.readouterr().out
    assert json.loads(out)["run"] == f"run{PAYLOAD}"
    assert not _CONTROL.findall(out.replace("\n", ""))


def test_checkpoint_verify_prints_no_escape_from_a_manifest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A manifest names files with the payload; verify's problems quote them."""
    from babysitter.checkpoints import build_manifest

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    victim = ckpt / f"shard{ESC_CLEAR}{C1_CSI}{BIDI}.bin"
    victim.write_bytes(b"x" * 64)
    assert build_manifest(ckpt, run="r", step=1, part_wait=0.0).kind == "manifest"
    victim.unlink()  # so verify names it as missing
    assert main(["checkpoint", "verify", str(ckpt)]) == 1
    out, err = capsys.readouterr()
    assert "shard" in out
    assert_clean(out + err, terminal=False)


# ------------------------------------------------------------------ what Prometheus answers


class _FakeProm(http.server.BaseHTTPRequestHandler):
    """Prometheus' HTTP API, answering every query with one series whose labels carry the payload
    (the code path that renders Prometheus answers is real; the values are what a rank could export)."""

    payload = PAYLOAD

    def do_POST(self) -> None:
        evil = self.payload  # the module's payload, or the one a test picked
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self._answer(
            {
                "resultType": "vector",
                "result": [
                    {
                        "metric": {
                            "run": f"run{evil}",
                            "instance": f"node{evil}",
                            "gpu": f"0{C1_CSI}",
                            "xid": "79",
                            "cluster": f"c{evil}",
                        },
                        "value": [0, "1"],
                    }
                ],
            }
        )

    def do_GET(self) -> None:
        evil = self.payload
        if self.path.startswith("/api/v1/alerts"):
            labels = {"alertname": f"Evil{evil}", "severity": "critical", "run": f"run{evil}"}
            alert = {"labels": labels, "annotations": {"summary": evil}, "state": "firing"}
            self._answer({"alerts": [alert]})
        else:
            self._answer({"groups": []})

    def _answer(self, data: Any) -> None:
        body = json.dumps({"status": "success", "data": data}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def evil_prometheus(request: pytest.FixtureRequest) -> Iterator[str]:
    handler = type("Handler", (_FakeProm,), {"payload": getattr(request, "param", PAYLOAD)})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.mark.parametrize("terminal", [False, True], ids=["piped", "terminal"])
@pytest.mark.parametrize("columns", ["80", "200"])
def test_top_prints_label_values_as_text(
    evil_prometheus: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    terminal: bool,
    columns: str,
) -> None:
    """Run, node and alert labels carry the payload; ``[link=...]`` must not become a hyperlink."""
    if terminal:
        monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", columns)
    code = main(["top", "--prometheus", evil_prometheus, "--once", "--timeout", "5"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "Evil" in out and "node" in out
    assert_clean(out + err, terminal=terminal)


@pytest.mark.parametrize("evil_prometheus", [MARKUP], indirect=True)
def test_markup_alone_in_a_label_is_no_hyperlink(
    evil_prometheus: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without a single control character in the data, rich markup in a label value made ``top``
    print an OSC 8 hyperlink: the value is shown as the text it is."""
    monkeypatch.setenv("FORCE_COLOR", "1")
    monkeypatch.setenv("COLUMNS", "200")
    assert main(["top", "--prometheus", evil_prometheus, "--once", "--timeout", "5"]) == 0
    out = capsys.readouterr().out
    assert "\x1b]8;" not in out
    assert _SGR.sub("", out).count(MARKUP) >= 2, out  # the run and the node, at least


def test_scorecard_prints_cluster_names_as_text(
    evil_prometheus: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FORCE_COLOR", "1")
    main(["scorecard", "--prometheus", evil_prometheus, "--timeout", "5"])
    out, err = capsys.readouterr()
    assert_clean(out + err, terminal=True)


def test_the_demo_panel_prints_label_values_as_text() -> None:
    """The demo's live panel renders the same frames as top, in its own layout."""
    import io
    import time

    from rich.console import Console

    from babysitter.demo.panel import panel
    from babysitter.views.top import AlertRow, Frame, NodeRow, RunRow

    frame = Frame(
        time.time(),
        "x",
        (RunRow(run=f"r{PAYLOAD}", ranks=1),),
        (NodeRow(instance=f"n{PAYLOAD}", gpus=8, lost=(f"3{C1_CSI}",), xids={"79": 1}),),
        (AlertRow(f"A{PAYLOAD}", "firing", "critical", {"gpu": f"6{PAYLOAD}"}, None, PAYLOAD),),
        (),
    )
    out = io.StringIO()
    Console(file=out, width=80, force_terminal=True).print(panel(frame, None, t0=time.time(), duration=60))
    assert_clean(out.getvalue(), terminal=True)


def test_the_shared_function_and_label_values() -> None:
    """clean() drops C0 (tab and newline become spaces), DEL, C1 and bidi controls; label values
    lose C1 too (0x9b is CSI on a terminal that reads 8-bit controls)."""
    assert clean(f"a{ESC_CLEAR}b\x9b2Jc\u202ed\u2066e\x7ff\tg\nh") == "a[2Jb2Jcdef g h"
    assert clean("a\tb\nc\rd", multiline=True) == "a\tb\ncd"
    assert clean("caf\u00e9 \u4e2d") == "caf\u00e9 \u4e2d", "printable text is kept"
    assert sanitize_value(f"v{C1_CSI}\x85\u202e") == "v2J"


def _exposition_value(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def test_top_against_a_real_prometheus(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A real Prometheus scrapes a target whose label values carry the payload (the exposition
    format escapes only backslash, quote and newline): what it answers reaches ``top`` clean."""
    from promkit import PrometheusServer

    run = _exposition_value(f"run{PAYLOAD}")
    gpu = _exposition_value(f"0{PAYLOAD}")
    body = (
        f'# TYPE train_steps_total counter\ntrain_steps_total{{run="{run}",rank="0"}} 5\n'
        f'# TYPE gpu_up gauge\ngpu_up{{gpu="{gpu}"}} 0\n'
    ).encode()

    class Target(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Target)
    thread = threading.Thread(target=target.serve_forever, daemon=True)
    thread.start()
    try:
        with PrometheusServer(tmp_path, targets=[f"127.0.0.1:{target.server_address[1]}"]) as prom:
            stored = prom.wait_for("train_steps_total")
            assert stored[0]["metric"]["run"] == f"run{PAYLOAD}", "Prometheus keeps the bytes as scraped"
            prom.wait_for("gpu_up")
            with pytest.MonkeyPatch.context() as mp:
                mp.setenv("FORCE_COLOR", "1")
                mp.setenv("COLUMNS", "200")
                assert main(["top", "--prometheus", prom.url, "--once", "--timeout", "5"]) == 0
    finally:
        target.shutdown()
        target.server_close()
        thread.join(timeout=5)
    out, err = capsys.readouterr()
    assert "run" in out and "[link=http://evil]x[/link]" in _SGR.sub("", out)
    assert_clean(out + err, terminal=True)


def test_explain_prints_no_escape_from_prometheus(
    evil_prometheus: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """explain's causes quote instance, GPU and run labels from its answers."""
    argv = ["explain", "--prometheus", evil_prometheus, "--run", f"run{PAYLOAD}", "--rate-window", "1m"]
    assert main([*argv, "--timeout", "5"]) == 0
    out, err = capsys.readouterr()
    assert "instance=node" in out, out
    assert_clean(out + err, terminal=False)


def test_the_demo_prints_pages_as_text() -> None:
    """The demo's page lines quote an alert's labels and summary from Alertmanager."""
    import io
    import time

    from rich.console import Console

    from babysitter.demo.pager import Page
    from babysitter.demo.view import DemoView

    out = io.StringIO()
    view = DemoView(Console(file=out, width=80, force_terminal=True), t0=time.time(), duration=60, live=False)
    labels = {"run": f"r{PAYLOAD}", "gpu": f"6{PAYLOAD}"}
    view.page(Page(time.time(), "firing", f"A{PAYLOAD}", "critical", labels, PAYLOAD, "pager"))
    view.page(Page(time.time(), "resolved", f"A{PAYLOAD}", "critical", labels, PAYLOAD, f"chat{PAYLOAD}"))
    assert "PAGE" in out.getvalue() and "RESOLVED" in out.getvalue()
    assert_clean(out.getvalue(), terminal=True)


def test_log_lines_are_cleaned_too(tmp_path: Path) -> None:
    """The CLI's log formatter cleans every line: the remediator and the node agent log label values
    from alerts and registrations. Shown through the console script with a file name that carries
    the payload (what a log line quotes)."""
    import os
    import subprocess
    import sys

    policy = tmp_path / f"policy{ESC_CLEAR}{OSC_TITLE}{C1_CSI}.json"
    src = Path(__file__).resolve().parent.parent / "src"
    proc = subprocess.run(
        [sys.executable, "-m", "babysitter", "remediate", "--policy", str(policy), "--check"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(src)},
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2
    assert "ERROR" in proc.stderr and "policy[2J]0;pwned" in proc.stderr, proc.stderr
    assert_clean(proc.stdout + proc.stderr, terminal=False)


def test_the_demo_closing_explanations_are_clean() -> None:
    """After the fault table the demo repeats each explanation, which quotes Prometheus' labels."""
    import io
    import types

    from rich.console import Console

    from babysitter.demo.runner import _Demo
    from babysitter.demo.scenario import default_scenario

    scenario = default_scenario()
    result = types.SimpleNamespace(event=scenario.events[0], line=lambda: f"explained: host n{PAYLOAD}")
    explainer = types.SimpleNamespace(
        results=[result], delay=20.0, close=lambda wait: None, command=lambda r: "babysitter explain ..."
    )
    out = io.StringIO()
    demo = _Demo.__new__(_Demo)  # the summary needs no stack: only these
    demo.console = Console(file=out, width=120, force_terminal=True)
    demo.explainer, demo.scenario = explainer, scenario
    demo.explained_summary()
    assert "explained: host n" in out.getvalue()
    assert_clean(out.getvalue(), terminal=True)
