"""TLS for hamq's listeners and connections: contexts from PEM files, bounded handshakes.

TLS is off unless a ``TlsConfig`` is given (``RemotingConfig.tls``); plain TCP is the
default. One TlsConfig is a node's identity and trust, used both ways:
- listening (remoting server, HA master): ``cert_file`` (with ``key_file``, or the key
  in the same file) is presented; with ``verify_client`` a peer must present a
  certificate signed by ``ca_file`` (mutual TLS);
- connecting (clients, a broker's own calls, the HA slave): ``ca_file`` is trusted
  (none: the system's CAs); the server's certificate must name the host connected to
  when ``check_hostname`` (an address given as an IP needs an IP subjectAltName);
  ``cert_file`` is presented when given.
So a cluster turns TLS on everywhere at once: a TLS client cannot talk to a plain
listener, nor a plain client to a TLS one (the handshake fails; one line in the log).

Errors: a TlsConfig checks its files when it is made, so a missing, unreadable,
non-PEM, encrypted or mismatched file is a ``TlsConfigError`` (a ValueError) naming
the file before anything listens. A handshake that fails or outlasts
``handshake_timeout_s`` is a ``TlsHandshakeError`` (a trio.BrokenResourceError,
naming the peer and the reason); the stream is then closed and useless.
"""

from __future__ import annotations

import re
import ssl
from pathlib import Path

import anyio
import anyio.abc
import attrs
import trio
from anyio.streams.tls import TLSStream
from attrs import validators as v

#: by default a peer has this long to complete the TLS handshake (a slowloris guard)
DEFAULT_HANDSHAKE_TIMEOUT_S = 10.0

_CERTIFICATE = b"-----BEGIN CERTIFICATE-----"
_PRIVATE_KEY = re.compile(rb"-----BEGIN (?:[A-Z]+ )?PRIVATE KEY-----")


class TlsConfigError(ValueError):
    """A TLS configuration that cannot be used; the text names the file and the fault."""


class TlsHandshakeError(trio.BrokenResourceError, anyio.BrokenResourceError):
    """A TLS handshake failed or timed out; the text names the peer and why.

    Both Trio's and AnyIO's BrokenResourceError: the listeners and the HA slave run on
    Trio, clients on AnyIO."""


@attrs.frozen
class TlsConfig:
    #: PEM certificate chain presented by a listener (and by a client, if given)
    cert_file: Path | None = None
    #: PEM private key of cert_file; none: the key is in cert_file
    key_file: Path | None = None
    #: PEM certificate(s) trusted: servers' (as a client), clients' (verify_client);
    #: none: the system's CAs
    ca_file: Path | None = None
    #: a listener requires a client certificate signed by ca_file (mutual TLS)
    verify_client: bool = False
    #: a client requires the server's certificate to name the host it connects to
    check_hostname: bool = True
    #: a peer that has not completed the handshake by then is cut
    handshake_timeout_s: float = attrs.field(
        default=DEFAULT_HANDSHAKE_TIMEOUT_S, validator=v.gt(0.0)
    )

    def __attrs_post_init__(self) -> None:
        if self.key_file is not None and self.cert_file is None:
            raise TlsConfigError(f"tls key_file {self.key_file} is given without cert_file")
        if self.verify_client and self.ca_file is None:
            raise TlsConfigError(
                "tls verify_client needs ca_file (the CA that signs client certificates)"
            )
        # load every file now: a bad one is reported at start, naming it
        make_client_context(self)

    @property
    def can_listen(self) -> bool:
        return self.cert_file is not None


def make_server_context(config: TlsConfig) -> ssl.SSLContext:
    """The context of a TLS listener; TlsConfigError if a file is missing or bad."""
    if config.cert_file is None:
        raise TlsConfigError(
            "TLS on a listener needs cert_file (the server's PEM certificate chain) "
            "and its key (key_file, or in cert_file)"
        )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_identity(context, config.cert_file, config.key_file)
    if config.verify_client:
        assert config.ca_file is not None  # TlsConfig checks
        _load_ca(context, config.ca_file)
        context.verify_mode = ssl.CERT_REQUIRED
    return context


def make_client_context(config: TlsConfig) -> ssl.SSLContext:
    """The context of a TLS client; TlsConfigError if a file is missing or bad."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = config.check_hostname
    if config.ca_file is not None:
        _load_ca(context, config.ca_file)
    else:
        context.load_default_certs(ssl.Purpose.SERVER_AUTH)
    if config.cert_file is not None:
        _load_identity(context, config.cert_file, config.key_file)
    return context


def _read(field: str, path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise TlsConfigError(
            f"tls {field} {path}: cannot read it ({exc.strerror or exc})"
        ) from None


def _load_identity(context: ssl.SSLContext, cert_file: Path, key_file: Path | None) -> None:
    if _CERTIFICATE not in _read("cert_file", cert_file):
        raise TlsConfigError(f"tls cert_file {cert_file} holds no PEM certificate")
    key_field, key_path = ("key_file", key_file) if key_file else ("cert_file", cert_file)
    key = _read(key_field, key_path)
    if not _PRIVATE_KEY.search(key):
        hint = "" if key_file else " (give key_file)"
        raise TlsConfigError(f"tls {key_field} {key_path} holds no PEM private key{hint}")
    if b"ENCRYPTED" in key:
        raise TlsConfigError(
            f"tls {key_field} {key_path} is encrypted; hamq needs an unencrypted key "
            "(protect it with file permissions)"
        )
    try:
        # a password callback, so that OpenSSL never prompts on a terminal
        context.load_cert_chain(cert_file, key_file, password=_no_password)
    except ssl.SSLError as exc:
        if exc.reason == "KEY_VALUES_MISMATCH":
            raise TlsConfigError(
                f"tls {key_field} {key_path} is not the key of cert_file {cert_file}"
            ) from None
        raise TlsConfigError(
            f"tls cert_file {cert_file} / {key_field} {key_path} cannot be used: {_ssl_reason(exc)}"
        ) from None


def _no_password() -> bytes:
    return b""


def _load_ca(context: ssl.SSLContext, ca_file: Path) -> None:
    if _CERTIFICATE not in _read("ca_file", ca_file):
        raise TlsConfigError(f"tls ca_file {ca_file} holds no PEM certificate")
    try:
        context.load_verify_locations(cafile=ca_file)
    except ssl.SSLError as exc:
        raise TlsConfigError(f"tls ca_file {ca_file} cannot be used: {_ssl_reason(exc)}") from None


def _ssl_reason(exc: BaseException) -> str:
    """'certificate verify failed: self-signed certificate', 'wrong version number':
    OpenSSL's reason in words."""
    if isinstance(exc, ssl.SSLCertVerificationError) and exc.verify_message:
        return f"certificate verify failed: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError) and exc.reason:
        return str(exc.reason).lower().replace("_", " ")
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__


def _handshake_reason(exc: BaseException) -> str:
    cause = exc.__cause__
    if cause is None:
        return "the peer closed the connection"
    if isinstance(cause, ssl.SSLEOFError):
        return "the peer closed the connection"
    return _ssl_reason(cause)


async def _handshake(
    tls: trio.SSLStream[trio.SocketStream], peer: str, timeout_s: float
) -> trio.SSLStream[trio.SocketStream]:
    try:
        with trio.fail_after(timeout_s):
            await tls.do_handshake()
    except trio.TooSlowError:
        error = TlsHandshakeError(f"{peer}: TLS handshake not completed within {timeout_s:g}s")
    except (trio.BrokenResourceError, trio.ClosedResourceError) as exc:
        error = TlsHandshakeError(f"{peer}: TLS handshake failed: {_handshake_reason(exc)}")
    else:
        return tls
    with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(tls)
    raise error


async def server_handshake(
    stream: trio.SocketStream, context: ssl.SSLContext, *, peer: str, timeout_s: float
) -> trio.SSLStream[trio.SocketStream]:
    """``stream`` as the server's side of TLS, handshake done within ``timeout_s``.

    TlsHandshakeError if it fails or takes longer; ``stream`` is then closed.
    """
    tls = trio.SSLStream(stream, context, server_side=True)
    return await _handshake(tls, peer, timeout_s)


@attrs.frozen
class ClientTls:
    """What a connecting side needs: the context (built once) and the handshake's deadline."""

    context: ssl.SSLContext
    handshake_timeout_s: float

    @classmethod
    def of(cls, config: TlsConfig | None) -> ClientTls | None:
        """None when TLS is off; TlsConfigError if a file is missing or bad."""
        if config is None:
            return None
        return cls(make_client_context(config), config.handshake_timeout_s)

    async def wrap(
        self, stream: trio.SocketStream, *, host: str, peer: str
    ) -> trio.SSLStream[trio.SocketStream]:
        """``stream`` as the client's side of TLS with the server ``host``, handshake done.

        TlsHandshakeError (naming ``peer``) if it fails or times out; ``stream`` is
        then closed.
        """
        tls = trio.SSLStream(stream, self.context, server_hostname=host)
        return await _handshake(tls, peer, self.handshake_timeout_s)

    async def wrap_anyio(
        self, stream: anyio.abc.SocketStream, *, host: str, peer: str
    ) -> TLSStream:
        """``wrap`` for an AnyIO stream (the client, under Trio or asyncio)."""
        timeout_s = self.handshake_timeout_s
        try:
            with anyio.fail_after(timeout_s):
                return await TLSStream.wrap(stream, hostname=host, ssl_context=self.context)
        except TimeoutError:
            error = TlsHandshakeError(f"{peer}: TLS handshake not completed within {timeout_s:g}s")
        except (ssl.SSLError, anyio.EndOfStream, anyio.BrokenResourceError, OSError) as exc:
            if isinstance(exc, anyio.EndOfStream | ssl.SSLEOFError):
                reason = "the peer closed the connection"
            else:
                reason = _handshake_reason(exc) if exc.__cause__ else _ssl_reason(exc)
            error = TlsHandshakeError(f"{peer}: TLS handshake failed: {reason}")
        with anyio.CancelScope(shield=True):
            await anyio.aclose_forcefully(stream)
        raise error


async def open_stream(host: str, port: int, tls: ClientTls | None, *, peer: str) -> trio.abc.Stream:
    """A TCP connection to ``host:port``, TLS on top when ``tls`` is given.

    OSError when the connection cannot be opened, TlsHandshakeError when TLS fails;
    the caller bounds the connect's time (the handshake has its own deadline).
    """
    stream = await trio.open_tcp_stream(host, port)
    if tls is None:
        return stream
    return await tls.wrap(stream, host=host, peer=peer)
