"""Certificate files, checked when a config is loaded and loaded whole or not at all.

Shared by the agent (its client certificate, the CA it trusts) and the controller (its
server certificate, the CA of its clients). Messages name files, never their contents.
"""

from __future__ import annotations

import contextlib
import os
import ssl
import tempfile
from collections.abc import Iterator
from pathlib import Path


def readable_file(value: str | None) -> None:
    """A check for ``setting(check=...)``: the file exists and can be read."""
    if value is None:
        return
    try:
        with open(value, "rb") as handle:
            handle.read(1)
    except FileNotFoundError:
        raise ValueError(f"no such file: {value}") from None
    except IsADirectoryError:
        raise ValueError(f"is a directory, not a file: {value}") from None
    except OSError as err:
        raise ValueError(f"cannot read {value}: {err.strerror or err}") from None


def ca_bundle(value: str | None) -> None:
    """A check for ``setting(check=...)``: a readable PEM bundle of CA certificates."""
    if value is None:
        return
    readable_file(value)
    try:
        ssl.create_default_context(cafile=value)
    except ssl.SSLError as err:
        raise ValueError(f"not a PEM file of CA certificates: {value} ({err.reason})") from None


def check_key_pair(cert_file: str, key_file: str) -> None:
    """ValueError unless ``cert_file`` and ``key_file`` load as one certificate and key."""
    with _snapshot(cert_file, key_file) as (cert, key):
        _load(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), cert, key, cert_file, key_file)


def load_key_pair(context: ssl.SSLContext, cert_file: str, key_file: str) -> None:
    """Replace ``context``'s certificate and key, or leave them as they were.

    ``SSLContext.load_cert_chain`` is not all-or-nothing: a certificate that does not
    match the key already loaded replaces the certificate and drops the key, and the
    context then fails every handshake. So the pair is read once, tried on a scratch
    context, and only then loaded into ``context`` from the same bytes (an in-memory
    file), so that files replaced in between cannot slip a bad pair through.
    """
    with _snapshot(cert_file, key_file) as (cert, key):
        _load(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), cert, key, cert_file, key_file)
        _load(context, cert, key, cert_file, key_file)


def _load(context: ssl.SSLContext, cert: str, key: str, cert_file: str, key_file: str) -> None:
    try:
        context.load_cert_chain(cert, key)
    except ssl.SSLError as err:
        raise ValueError(f"{cert_file} and {key_file} are not a certificate and its key "
                         f"({err.reason or err})") from None
    except OSError as err:
        raise ValueError(f"cannot read {cert_file} or {key_file}: {err.strerror or err}") \
            from None


@contextlib.contextmanager
def _snapshot(cert_file: str, key_file: str) -> Iterator[tuple[str, str]]:
    """Paths to private copies of both files, taken now, gone afterwards.

    In memory (``memfd_create``) where the platform has it, else in a directory only
    this user can read.
    """
    blobs = []
    for path in (cert_file, key_file):
        try:
            blobs.append(Path(path).read_bytes())
        except OSError as err:
            raise ValueError(f"cannot read {path}: {err.strerror or err}") from None
    with contextlib.ExitStack() as stack:
        paths = [stack.enter_context(_private_copy(blob, name))
                 for blob, name in zip(blobs, ("cert.pem", "key.pem"), strict=True)]
        yield paths[0], paths[1]


@contextlib.contextmanager
def _private_copy(blob: bytes, name: str) -> Iterator[str]:
    memfd = getattr(os, "memfd_create", None)
    if memfd is not None and os.path.isdir("/proc/self/fd"):
        fd = memfd(name, getattr(os, "MFD_CLOEXEC", 0))
        try:
            os.write(fd, blob)
            yield f"/proc/self/fd/{fd}"
        finally:
            os.close(fd)
        return
    with tempfile.TemporaryDirectory(prefix="sn-tls-") as directory:  # mode 0700
        path = os.path.join(directory, name)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, blob)
        finally:
            os.close(fd)
        yield path


__all__ = ["ca_bundle", "check_key_pair", "load_key_pair", "readable_file"]
