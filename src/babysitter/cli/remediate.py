"""``babysitter remediate``: an Alertmanager webhook receiver that drains, requeues and annotates, safely.

Examples::

    babysitter remediate --policy /etc/babysitter/remediate.yaml --check
    babysitter remediate --policy remediate.yaml --listen-address 127.0.0.1:9097 --token-file token
    babysitter remediate --policy remediate.yaml --dry-run --token-file token  # plan and audit only

It serves only with authentication: the bearer token Alertmanager sends (``--token-file``, the file its
``http_config.authorization.credentials_file`` names) or client certificates (``--tls-client-ca``).
``--insecure-no-auth`` serves without, on a loopback address only: anyone on the host can then make it
act.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import stat
import sys
import threading
from pathlib import Path
from typing import Any

__all__ = ["register"]

log = logging.getLogger("babysitter.remediate")

DEFAULT_LISTEN = "127.0.0.1:9097"


def register(subparsers: Any) -> None:
    """Add the ``remediate`` subcommand."""
    parser = subparsers.add_parser(
        "remediate",
        help="act on alerts through the scheduler (drain, requeue, annotate) within safety rails",
        description=__doc__.split("\n\n")[0] if __doc__ else None,
        epilog="Policy format, rails and backends: docs/remediate.md.",
    )
    parser.add_argument("--policy", type=Path, required=True, help="policy file (.yaml, .toml or .json)")
    parser.add_argument("--check", action="store_true", help="check the policy, print what it does, exit")
    parser.add_argument("--dry-run", action="store_true", help="plan and audit every action, run none")
    parser.add_argument(
        "--listen-address", default=DEFAULT_LISTEN, help=f"HOST:PORT to serve on (default {DEFAULT_LISTEN})"
    )
    parser.add_argument("--port-file", type=Path, help="write the bound HOST:PORT here once serving (tests)")
    parser.add_argument("--path", default="/alerts", help="URL path of the webhook (default /alerts)")
    parser.add_argument(
        "--token-file", type=Path, help="file holding the bearer token Alertmanager must send"
    )
    parser.add_argument("--tls-cert", help="server certificate (PEM); serves HTTPS")
    parser.add_argument("--tls-key", help="server key (PEM)")
    parser.add_argument(
        "--tls-client-ca", help="CA file: clients must present a certificate it signed (mTLS)"
    )
    parser.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="serve without a token or client certificates (loopback only: anyone on the host can act)",
    )
    parser.set_defaults(func=_main)


def _split(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"--listen-address {address!r}: expected HOST:PORT")
    host = host.strip("[]")
    if not host:
        raise ValueError("--listen-address: give the host explicitly (127.0.0.1, 0.0.0.0, ::)")
    return host, int(port)


def _token(path: Path) -> str:
    try:
        info = path.stat()
        text = path.read_text(encoding="utf-8").strip()
    except OSError as exc:
        raise ValueError(f"--token-file {path}: {exc.strerror or exc}") from None
    if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ValueError(f"--token-file {path}: readable by others (chmod 600 it)")
    if len(text) < 16:
        raise ValueError(f"--token-file {path}: the token is shorter than 16 characters")
    return text


def _check_auth(host: str, *, token: bool, mtls: bool, args: argparse.Namespace) -> None:
    """ValueError unless requests are authenticated, or ``--insecure-no-auth`` is given on loopback."""
    from babysitter.remediate.server import is_loopback

    if args.insecure_no_auth:
        if token or mtls:
            raise ValueError("--insecure-no-auth with --token-file or --tls-client-ca: choose one")
        if not is_loopback(host):
            raise ValueError(
                f"--insecure-no-auth serves only on a loopback address (127.0.0.1, ::1), not {host}"
            )
    elif not (token or mtls):
        raise ValueError(
            "refusing to serve without authentication: anyone who reaches the receiver could drain "
            "nodes and requeue jobs. Give --token-file (a 0600 file holding the token Alertmanager sends "
            "with http_config.authorization.credentials_file, see exporters/alertmanager.yml) or "
            "--tls-client-ca (mTLS), or --insecure-no-auth on a loopback address for a test"
        )


def _describe(policy: Any) -> str:
    lines = [f"backend {policy.backend}; audit log {policy.audit_log}; dry run {policy.dry_run}"]
    lines.append(
        f"rails: at most {policy.rate_limit.actions} disruptive actions per {policy.rate_limit.window:g} s; "
        f"at most {policy.drain_cap.fraction:.0%} of the nodes (min {policy.drain_cap.min_nodes}) "
        f"drained per {policy.drain_cap.window:g} s"
    )
    inc = policy.incidents
    if inc.enabled:
        lines.append(
            f"incidents: a bundle before every action, and for {', '.join(p.pattern for p in inc.alerts)}; "
            f"ranks answer within {inc.limits.wait:g} s; {inc.limits.max_incidents} bundles of "
            f"{inc.limits.max_bytes // (1024 * 1024)} MiB at most per run"
            + (f"; hosts' incidents in {inc.dir}" if inc.dir else "")
        )
    else:
        lines.append("incidents: off (no evidence bundle is gathered before acting)")
    for rule in policy.rules:
        match = ", ".join(f"{k}=~{v.pattern}" for k, v in rule.match.items())
        extra = f", after {rule.firing_for:g} s firing" if rule.firing_for else ""
        extra += ", undrain on resolve" if rule.undrain_on_resolve else ""
        extra += ", dry run" if policy.is_dry_run(rule) else ""
        if rule.hosts_from == "culprit":
            extra += f", on the culprit's host (at most {rule.max_culprit_hosts}; never a waiting rank's)"
        lines.append(f"rule {rule.name}: {match} -> {' + '.join(rule.actions)}{extra}")
    return "\n".join(lines)


def _main(args: argparse.Namespace) -> int:
    from babysitter.remediate.audit import AuditLog
    from babysitter.remediate.backends import BackendError, make_backend
    from babysitter.remediate.engine import Remediator
    from babysitter.remediate.jobmap import PrometheusJobMap
    from babysitter.remediate.policy import PolicyError, load_policy
    from babysitter.remediate.runs import RunNotes
    from babysitter.remediate.server import WebhookServer

    try:
        policy = load_policy(args.policy)
        host, port = _split(args.listen_address)
        token = _token(args.token_file) if args.token_file else None
        context = None
        if args.tls_cert or args.tls_key:
            if not (args.tls_cert and args.tls_key):
                raise ValueError("--tls-cert and --tls-key go together")
            from babysitter.export.server import tls_context

            context = tls_context(args.tls_cert, args.tls_key, args.tls_client_ca)
        elif args.tls_client_ca:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        if not args.check:
            _check_auth(host, token=token is not None, mtls=args.tls_client_ca is not None, args=args)
    except (PolicyError, ValueError, OSError) as exc:
        log.error("babysitter remediate: %s", exc)
        return 2
    if args.check:
        from babysitter.terminal import clean

        print(clean(_describe(policy), multiline=True))  # noqa: T201 - the check's output
        return 0
    if args.insecure_no_auth:
        log.warning(
            "babysitter remediate: SERVING WITHOUT AUTHENTICATION on %s (--insecure-no-auth): any local "
            "user or process can make it drain, requeue and undrain; give Alertmanager a token instead "
            "(--token-file, docs/remediate.md)",
            host,
        )
    try:
        backend = make_backend(policy)
        audit = AuditLog(policy.audit_log)
    except (BackendError, OSError) as exc:
        log.error("babysitter remediate: %s", exc)
        return 2
    jobmap = None
    if policy.jobs.prometheus_url:
        jobmap = PrometheusJobMap(
            policy.jobs.prometheus_url,
            lookback=policy.jobs.lookback,
            timeout=policy.jobs.timeout,
            cluster_label=policy.cluster_label,
        )
    notes = RunNotes(policy.run_dirs) if policy.run_dirs else None
    remediator = Remediator(
        policy,
        backend,
        audit,
        jobmap=jobmap,
        on_remediation=notes.record if notes else None,
        force_dry_run=args.dry_run,
    )
    from babysitter.remediate.incidents import hook_for

    remediator.incidents = hook_for(policy, jobmap, notes.run_dir if notes else None)
    try:
        server = WebhookServer(
            remediator,
            host,
            port,
            token=token,
            ssl_context=context,
            path=args.path,
            insecure_no_auth=args.insecure_no_auth,
        )
    except OSError as exc:
        from babysitter.export.server import bind_hint

        hint = bind_hint(
            exc, port, elsewhere="--listen-address HOST:PORT (HOST:0 with --port-file FILE: any free port)"
        )
        log.error(
            "babysitter remediate: cannot listen on %s: %s%s",
            args.listen_address,
            exc,
            f"; {hint}" if hint else "",
        )
        return 2
    server.start()
    if args.port_file:
        tmp = args.port_file.with_suffix(".tmp")
        tmp.write_text(f"{host}:{server.port}\n")
        os.replace(tmp, args.port_file)
    log.info(
        "babysitter remediate: serving %s (%s backend%s)",
        server.url,
        policy.backend,
        ", dry run" if args.dry_run or policy.dry_run else "",
    )
    stop = threading.Event()

    def _stop(signum: int, _frame: object) -> None:
        log.info("babysitter remediate: %s received", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    stop.wait()
    server.close()
    audit.close()
    sys.stdout.flush()
    return 0
