"""Self-checksummed JSON documents: the manifest and every sidecar.

A sealed document is pretty-printed JSON whose last member is its own checksum::

    { ...body...,
     "manifest_checksum": "xxh3-128:<hex of every byte before the comma>"
    }

The checksum covers the raw bytes, not a re-serialisation, so *any* changed byte
is detected, whitespace included, and the file must end exactly with the
expected trailer. The member keeps the name ``manifest_checksum`` in every
sealed document (format v1), so one reader verifies them all.

A document may also be signed (:mod:`mouthguard.format.signing`): the member
``"manifest_signature"`` then sits just before the checksum, and the signature
covers every byte before its own leading comma. The checksum covers the
signature too, so corruption is still found without a key, and an unsigned
document is byte for byte what it was before signatures existed.
"""

from __future__ import annotations

from collections.abc import Callable

from mouthguard.errors import FormatError
from mouthguard.format import typed_json
from mouthguard.format.checksum import xxh3_digest
from mouthguard.format.typed_json import JsonValue

TRAILER_KEY = "manifest_checksum"
_MARKER = f',\n "{TRAILER_KEY}": "'.encode()
_END = b'"\n}\n'
SIGNATURE_KEY = "manifest_signature"
_SIGNATURE_MARKER = f',\n "{SIGNATURE_KEY}": "'.encode()


class SealError(FormatError):
    """A sealed document is truncated, damaged or not sealed at all."""


def seal(body: dict[str, JsonValue], sign: Callable[[bytes], str] | None = None) -> bytes:
    """Serialise ``body`` and append its checksum trailer (and signature, with ``sign``).

    ``sign`` maps the bytes to be signed to the signature's text (no quotes or
    backslashes); the signature member is inserted before the checksum.

    Exposed so that tools (and hostile-input tests) can produce documents whose
    checksum is valid but whose content is not: the checksum proves integrity,
    never sanity; readers check both. (An empty body seals into invalid JSON,
    which :func:`unseal` rejects.)
    """
    text = typed_json.dumps_strict(body, indent=1).encode()
    prefix = text[: text.rindex(b"}")].rstrip()
    if sign is not None:
        prefix += _SIGNATURE_MARKER + sign(prefix).encode() + b'"'
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


def signed_part(raw: bytes) -> tuple[bytes, str] | None:
    """For a document :func:`unseal` accepted: (the bytes signed, the signature) or None.

    None when the document carries no signature member right before its checksum.
    The caller checks that the parsed body's signature member agrees.
    """
    head = raw[: raw.rfind(_MARKER)]
    cut = head.rfind(_SIGNATURE_MARKER)
    if cut < 0 or not head.endswith(b'"'):
        return None
    value = head[cut + len(_SIGNATURE_MARKER) : -1]
    if b'"' in value or b"\\" in value or b"\n" in value:
        return None
    return head[:cut], value.decode("ascii", errors="replace")
