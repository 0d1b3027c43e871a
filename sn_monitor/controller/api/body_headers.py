"""Refusing a body by its headers, before any of it is read: its length and media type.

Shared by the reports' gate (both lanes) and every other route that reads a body.
"""

from __future__ import annotations

from typing import Final

from sn_monitor.controller.errors import TooLarge, UnsupportedMedia

#: What the JSON routes read; ``POST /api/v1/jobs`` reads YAML too (its registered type
#: and the two older names clients still send).
JSON_MEDIA: Final = ("application/json",)
JSON_OR_YAML_MEDIA: Final = (*JSON_MEDIA, "application/yaml", "application/x-yaml",
                             "text/yaml")


def whole_number(text: str) -> int | None:
    """``text`` as a non-negative integer if it is one in ASCII digits, else None.

    ``str.isdigit`` alone lets through characters ``int`` refuses (``²``).
    """
    return int(text) if text.isascii() and text.isdigit() else None


def declared_length(value: str | None) -> int | None:
    """A ``Content-Length`` value as a number; None when there is none (or it is no number)."""
    return whole_number(value) if value is not None else None


def announces_over(length: str | None, limit: int) -> bool:
    """Whether a ``Content-Length`` value announces more than ``limit`` bytes."""
    declared = declared_length(length)
    return declared is not None and declared > limit


def check_body_headers(length: str | None, encoding: str | None, media_type: str | None, *,
                       limit: int, accepted: tuple[str, ...]) -> None:
    """Refuse a body by its headers, before any of it is read: TooLarge or UnsupportedMedia.

    413: ``Content-Length`` announces more than ``limit`` bytes. 415: a body is announced
    (a ``Content-Length`` other than 0, or a ``Transfer-Encoding``) and its
    ``Content-Type`` is none of ``accepted`` (parameters such as ``; charset=utf-8``
    aside, in any case), or it has none: the API never guesses what a body is. A
    request without a body needs no Content-Type.
    """
    if announces_over(length, limit):
        raise TooLarge(f"body larger than {limit} bytes")
    if encoding is None and (length is None or declared_length(length) == 0):
        return
    if media_type is None:
        raise UnsupportedMedia(f"a body without a Content-Type: send {' or '.join(accepted)}")
    if media_type.partition(";")[0].strip().lower() not in accepted:
        raise UnsupportedMedia(f"unsupported media type {media_type[:100]!r}: send "
                               f"{' or '.join(accepted)}")
