"""watch() checks the endpoint's settings at setup (issue 12, point 14): TLS files, the bind address,
the port a LOCAL_RANK leads to, and label values. Each case used to pass setup silently and fail later
(or serve the string "None")."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

import babysitter


def _watch(**kwargs: Any) -> babysitter.Tracker:
    kwargs = {"port": 0, "peak_flops": 1e12, "ledger": False, "hang_timeout": None, **kwargs}
    return babysitter.watch(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        (
            {"tls": babysitter.TLSConfig("/nonexistent/cert.pem", "/nonexistent/key.pem")},
            ValueError,
            "cert.pem",
        ),
        ({"tls": ("cert.pem", "key.pem")}, TypeError, "TLSConfig"),
        ({"addr": "not an address"}, ValueError, "addr"),
        ({"addr": "256.1.1.1"}, ValueError, "addr"),
        ({"addr": "192.0.2.1"}, ValueError, "not an address of this host"),  # TEST-NET-1, never local
        ({"labels": {"x": None}}, ValueError, "None"),
    ],
)
def test_endpoint_settings_fail_at_setup(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    """A wrong TLS file, address or label value fails watch() with a message naming it."""
    with pytest.raises(error, match=match):
        _watch(**kwargs)


def test_tls_files_that_are_not_a_certificate_fail_at_setup(tmp_path: Path) -> None:
    """Readable files that are not a PEM certificate and key fail at setup too, naming the file."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text("not a certificate\n")
    key.write_text("not a key\n")
    with pytest.raises(ValueError, match=r"cert\.pem"):
        _watch(tls=babysitter.TLSConfig(str(cert), str(key)))


def test_tls_client_ca_is_checked_at_setup(tmp_path: Path) -> None:
    """A missing client CA file (mutual TLS) fails at setup, naming it."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)),
        ],
        check=True,
        capture_output=True,
    )
    with pytest.raises(ValueError, match=r"clients\.pem"):
        _watch(tls=babysitter.TLSConfig(str(cert), str(key), client_cafile=str(tmp_path / "clients.pem")))
    tracker = _watch(tls=babysitter.TLSConfig(str(cert), str(key)))
    try:
        assert tracker.metrics_url is not None and tracker.metrics_url.startswith("https://127.0.0.1:")
    finally:
        tracker.close()


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"LOCAL_RANK": "99999"}, "LOCAL_RANK"),
        ({"LOCAL_RANK": "100", "BABYSITTER_PORT": "65500"}, "BABYSITTER_PORT"),
    ],
)
def test_local_rank_that_leads_past_the_last_port_fails_at_setup(
    monkeypatch: pytest.MonkeyPatch, env: dict[str, str], match: str
) -> None:
    """The default port is 9450 + LOCAL_RANK: a local rank that puts it past 65535 is a setup error."""
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=match):
        _watch(port=None)


def test_good_addresses_still_work() -> None:
    """Loopback by name and all-interfaces addresses pass and serve, with a loopback URL to register."""
    for addr in ("localhost", "0.0.0.0"):
        tracker = _watch(addr=addr)
        try:
            url = tracker.metrics_url
            assert url is not None and url.startswith(("http://127.0.0.1:", "http://[::1]:")), url
        finally:
            tracker.close()
