"""Self-checksummed JSON documents: the manifest and every sidecar.

A sealed document is pretty-printed JSON whose last member is its own checksum::

    { ...body...,
     "manifest_checksum": "xxh3-128:<hex of every byte before the comma>"
    }

The checksum covers the raw bytes, not a re-serialisation, so *any* changed byte
is detected, whitespace included, and the file must end exactly with the
expected trailer. The member keeps the name ``manifest_checksum`` in every
sealed document (format v1), so one reader verifies them all.
"""

from __future__ import annotations

from mouthguard.errors import FormatError
from mouthguard.format import typed_json
from mouthguard.format.checksum import xxh3_digest
from mouthguard.format.typed_json import JsonValue

TRAILER_KEY = "manifest_checksum"
_MARKER = f',\n "{TRAILER_KEY}": "'.encode()
_END = b'"\n}\n'


class SealError(FormatError):
    """A sealed document is truncated, damaged or not sealed at all."""


def seal(body: dict[str, JsonValue]) -> bytes:
    """Serialise ``body`` and append its checksum trailer.

    Exposed so that tools (and hostile-input tests) can produce documents whose
    checksum is valid but whose content is not: the checksum proves integrity,
    never sanity; readers check both. (An empty body seals into invalid JSON,
    which :func:`unseal` rejects.)
    """
    text = typed_json.dumps_strict(body, indent=1).encode()
    prefix = text[: text.rindex(b"}")].rstrip()
    return prefix + _MARKER + xxh3_digest(prefix).encode() + _END


def unseal(raw: bytes, what: str = "document") -> dict[str, JsonValue]:
    """Verify the trailer of ``raw`` and return its body (without the checksum member).

    Raises:
        SealError: the trailer is missing, the checksum does not match, or the
            bytes are not a strict JSON object. The message names ``what``.
    """
    cut = raw.rfind(_MARKER)
    if cut < 0 or not raw.endswith(_END):
        raise SealError(f"{what} has no checksum trailer (truncated or not a {what})")
    prefix, digest = raw[:cut], raw[cut + len(_MARKER) : -len(_END)]
    if xxh3_digest(prefix).encode() != digest:
        raise SealError(f"{what} checksum mismatch: the {what} is corrupt")
    try:
        body = typed_json.loads_strict(raw)
    except FormatError as exc:
        raise SealError(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise SealError(f"{what} is not a JSON object")
    body.pop(TRAILER_KEY, None)
    return body
