"""Node agent configuration: flags over environment over file, collector switches, setup errors."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from babysitter.catalog import node as N
from babysitter.node.config import ConfigError, add_arguments, load_config, parse_listen_address
from node_helpers import parse_exposition, read_port_file


def parse(*argv: str, env: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return load_config(parser.parse_args(list(argv)), env or {})


class TestSources:
    def test_defaults(self) -> None:
        """Loopback by default; gpu, xid and trainers on; storage and sentinel off without paths."""
        c = parse()
        assert (c.host, c.bind_port) == ("127.0.0.1", 9946)
        assert [n for n in ("gpu", "xid", "storage", "sentinel", "trainers") if c.enabled(n)] == [
            "gpu",
            "xid",
            "trainers",
        ]

    def test_flag_beats_environment_beats_file(self, tmp_path: Path) -> None:
        """Each source overrides the one below it, field by field."""
        cfg = tmp_path / "agent.json"
        cfg.write_text(
            json.dumps({"listen-address": "10.0.0.1:1000", "trainer_timeout": 7, "collector_timeout": 8})
        )
        env = {"BABYSITTER_NODE_TRAINER_TIMEOUT": "5", "BABYSITTER_NODE_LISTEN_ADDRESS": "10.0.0.2:2000"}
        c = parse("--config", str(cfg), "--listen-address", "0.0.0.0:3000", env=env)
        assert c.listen_address == "0.0.0.0:3000"
        assert c.trainer_timeout == 5.0
        assert c.collector_timeout == 8.0

    def test_toml_file_and_collectors_table(self, tmp_path: Path) -> None:
        """A TOML file (Python 3.11+) can switch collectors and give lists of paths."""
        if sys.version_info < (3, 11):
            pytest.skip("TOML needs Python 3.11")
        cfg = tmp_path / "agent.toml"
        cfg.write_text('storage_path = ["/a", "/b"]\n[collectors]\nxid = false\n')
        c = parse("--config", str(cfg))
        assert c.storage_path == [Path("/a"), Path("/b")]
        assert c.enabled("storage")
        assert not c.enabled("xid")

    def test_collector_switches(self) -> None:
        """--no-collector.NAME and BABYSITTER_NODE_COLLECTOR_NAME turn collectors off; the flag wins."""
        env = {"BABYSITTER_NODE_COLLECTOR_TRAINERS": "0", "BABYSITTER_NODE_COLLECTOR_XID": "0"}
        c = parse("--no-collector.gpu", "--collector.xid", env=env)
        assert not c.enabled("gpu")
        assert c.enabled("xid")
        assert not c.enabled("trainers")

    def test_sysfs_flags_spelled_as_node_exporter_does(self, tmp_path: Path) -> None:
        """--path.sysfs (and the dashed alias, the environment, a file key with a dot) names the tree the
        hardware collectors read; under --simulate they are off unless a tree is named."""
        (tmp_path / "sys").mkdir()
        assert parse("--path.sysfs", str(tmp_path / "sys")).sysfs == tmp_path / "sys"
        assert parse("--path-sysfs", str(tmp_path / "sys")).sysfs == tmp_path / "sys"
        assert parse(env={"BABYSITTER_NODE_PATH_PROCFS": str(tmp_path)}).procfs == tmp_path
        cfg = tmp_path / "agent.json"
        cfg.write_text(json.dumps({"path.sysfs": str(tmp_path / "sys"), "fabric-rescan-interval": 5}))
        c = parse("--config", str(cfg))
        assert (c.sysfs, c.fabric_rescan_interval) == (tmp_path / "sys", 5.0)
        assert parse().sysfs == Path("/sys") and parse().enabled("infiniband")
        assert not parse("--simulate", "2").enabled("pcie")
        assert parse("--simulate", "2", "--path.sysfs", str(tmp_path / "sys")).enabled("pcie")
        assert not parse("--no-collector.edac").enabled("edac")
        with pytest.raises(ConfigError, match="not a directory"):
            parse("--path.sysfs", str(tmp_path / "missing"))
        with pytest.raises(ConfigError, match="rescan interval"):
            parse("--fabric-rescan-interval", "-1")

    def test_environment_lists_use_pathsep(self) -> None:
        """A list in the environment is separated like PATH."""
        c = parse(env={"BABYSITTER_NODE_STORAGE_PATH": f"/x{os.pathsep}/y"})
        assert c.storage_path == [Path("/x"), Path("/y")]

    def test_port_overrides_listen_address(self) -> None:
        """--port 0 asks for an ephemeral port on the listen address's host."""
        c = parse("--listen-address", "[::1]:9946", "--port", "0")
        assert (c.host, c.bind_port) == ("::1", 0)


class TestErrors:
    @pytest.mark.parametrize(
        ("argv", "message"),
        [
            (["--listen-address", ":9946"], "HOST:PORT"),
            (["--listen-address", "localhost:http"], "not a number"),
            (["--port", "70000"], "out of range"),
            (["--tls-cert-file", "/etc/hostname"], "both"),
            (["--collector.storage"], "storage-path"),
            (["--collector.sentinel"], "checkpoint-run-dir"),
            (["--scenario", "x.json"], "--simulate"),
            (["--gpu-backend", "rocm"], "one of"),
            (["--trainer-timeout", "0"], "positive"),
            (["--trainer-timeout", "10"], "below the collector timeout"),
            (["--trainer-timeout", "3", "--collector-timeout", "2"], "below the collector timeout"),
            (["--simulate", "two"], "simulate"),
        ],
    )
    def test_bad_flags_are_setup_errors(self, argv: list[str], message: str) -> None:
        """Each mistake is a ConfigError naming the problem."""
        with pytest.raises(ConfigError, match=message):
            parse(*argv)

    def test_unknown_file_key_and_bad_json(self, tmp_path: Path) -> None:
        """A typo in the config file is an error, not silently ignored."""
        cfg = tmp_path / "a.json"
        cfg.write_text('{"listen_adress": "127.0.0.1:1"}')
        with pytest.raises(ConfigError, match="unknown key 'listen_adress'"):
            parse("--config", str(cfg))
        cfg.write_text("{")
        with pytest.raises(ConfigError, match=r"a\.json"):
            parse("--config", str(cfg))
        cfg.write_text('{"collectors": {"gpus": true}}')
        with pytest.raises(ConfigError, match="unknown collector"):
            parse("--config", str(cfg))

    def test_bad_environment_value(self) -> None:
        """A malformed environment value names the variable."""
        with pytest.raises(ConfigError, match="BABYSITTER_NODE_COLLECTOR_TIMEOUT"):
            parse(env={"BABYSITTER_NODE_COLLECTOR_TIMEOUT": "soon"})

    def test_parse_listen_address_ipv6(self) -> None:
        """Bracketed IPv6 hosts parse."""
        assert parse_listen_address("[::]:9100") == ("::", 9100)


def _agent(tmp_path: Path, *extra: str) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "babysitter",
        "node-agent",
        "--port",
        "0",
        "--port-file",
        str(tmp_path / "addr"),
    ]
    argv += ["--registry-dir", str(tmp_path / "reg"), *extra]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


class TestCommand:
    def test_simulated_agent_serves_and_stops_on_sigterm(self, tmp_path: Path) -> None:
        """`node-agent --simulate 2 --port 0 --port-file F` serves; SIGTERM stops it cleanly."""
        proc = _agent(tmp_path, "--simulate", "2", "--gpu-model", "A100")
        try:
            address = read_port_file(tmp_path / "addr")
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                s = parse_exposition(response.read().decode())
            assert s.value(N.GPU_UP.name, gpu="1", model="NVIDIA A100-SXM4-80GB") == 1
            assert s.value(N.NODE_INFO.name, backend="simulated", driver_version="570.124.06") == 1
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=20)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, out.decode()
        assert "node agent stopping" in out.decode()
        assert not (tmp_path / "addr").exists()

    def test_hung_gpu_fails_the_collector_and_does_not_block_shutdown(self, tmp_path: Path) -> None:
        """A GPU whose NVML calls hang: the gpu collector is reported failed, SIGTERM still stops the agent."""
        scenario = tmp_path / "hang.json"
        scenario.write_text(json.dumps([{"at": 0, "gpu": 0, "event": "hang", "seconds": 600}]))
        proc = _agent(
            tmp_path,
            "--simulate",
            "1",
            "--scenario",
            str(scenario),
            "--collector-timeout",
            "0.5",
            "--trainer-timeout",
            "0.2",
        )
        try:
            address = read_port_file(tmp_path / "addr")
            with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
                s = parse_exposition(response.read().decode())
            assert s.value(N.COLLECTOR_SUCCESS.name, collector="gpu") == 0
            assert s.value(N.COLLECTOR_SUCCESS.name, collector="trainers") == 1
            proc.send_signal(signal.SIGTERM)
            out, _ = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0, out.decode()
        assert "collector gpu failed: timed out after 0.5 s" in out.decode()

    def test_bad_configuration_exits_2_with_a_clear_message(self, tmp_path: Path) -> None:
        """A setup mistake exits with status 2 and one line saying what is wrong."""
        proc = _agent(tmp_path, "--simulate", "1", "--gpu-model", "Z9000")
        out, _ = proc.communicate(timeout=30)
        assert proc.returncode == 2
        assert "unknown GPU model 'Z9000'" in out.decode()

    def test_port_in_use_is_a_clear_error(self, tmp_path: Path) -> None:
        """An agent never silently moves to another port: a taken port is an error at start."""
        import socket

        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            sock.listen()
            port = sock.getsockname()[1]
            argv = [sys.executable, "-m", "babysitter", "node-agent", "--simulate", "1"]
            argv += ["--listen-address", f"127.0.0.1:{port}", "--registry-dir", str(tmp_path)]
            proc = subprocess.run(argv, capture_output=True, timeout=30)
        assert proc.returncode == 2
        assert f"cannot serve on 127.0.0.1:{port}" in proc.stderr.decode()
