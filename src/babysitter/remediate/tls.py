"""The webhook's TLS context: TLS 1.2 or later; with a client CA, clients must show a certificate (mTLS)."""

from __future__ import annotations

import ssl

__all__ = ["server_context"]


def server_context(certfile: str, keyfile: str, client_cafile: str | None = None) -> ssl.SSLContext:
    """A server context; OSError/ssl.SSLError naming the file that cannot be loaded."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(certfile=certfile, keyfile=keyfile)
    except (OSError, ssl.SSLError) as exc:
        raise OSError(f"cannot load TLS certificate {certfile!r} with key {keyfile!r}: {exc}") from None
    if client_cafile is not None:
        try:
            context.load_verify_locations(cafile=client_cafile)
        except (OSError, ssl.SSLError) as exc:
            raise OSError(f"cannot load TLS client CA {client_cafile!r}: {exc}") from None
        context.verify_mode = ssl.CERT_REQUIRED
    return context
