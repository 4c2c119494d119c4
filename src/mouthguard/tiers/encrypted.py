"""Client-side encryption: a tier wrapper that stores every object AES-256-GCM encrypted.

:class:`EncryptedTier` wraps any tier (meant for remote ones: an object store
run by someone else) so that the inner tier only ever sees ciphertext. What it
protects: the confidentiality of checkpoints and sidecars at rest and in
transit through the inner tier, and their integrity against anyone without the
key (a flipped, truncated, extended, reordered or swapped chunk fails
authentication). What it does not hide: object names, sizes (to within the
per-chunk tags) and timing.

Object format (version 1)::

    header   80 bytes   magic "MGCRYPT", version 1, key id (length + 32 bytes,
                        zero padded), chunk size (u32), 16-byte random salt,
                        7-byte random nonce prefix, 8-byte key check, 4 reserved
    chunk 0  C bytes of ciphertext + 16-byte GCM tag
    ...      (P // C full chunks)
    last     P % C bytes (possibly none) + tag: every object ends with a short
             chunk sealed as the last, so a writer never has to look ahead

* **Keys.** Each object gets its own AES-256 key: HKDF-SHA256 of the master key
  with the object's random salt. 8 more bytes of the same HKDF output are the
  *key check*: a reader with the wrong key (or an old key under a reused id) is
  told so (:class:`~mouthguard.errors.EncryptionKeyError`) instead of seeing every
  chunk as tampered, which would make the repair jobs condemn good copies.
* **Nonces** are ``prefix (7 random bytes) || chunk index (u32) || last-chunk
  flag``: unique within an object by construction, and across objects the key
  differs anyway (a fresh salt per put), so no (key, nonce) pair is ever reused.
* **Associated data** of chunk ``i``: the whole header, ``i``, the last-chunk
  flag and the object's key (its name). A chunk moved within the object, to
  another object, or to another name, fails authentication; so does dropping
  trailing chunks (the new last chunk was not sealed as last) or appending some.
* **No extra copies.** Whole chunks are encrypted straight from the caller's
  buffers and decrypted straight into the destination (``encrypt_into`` /
  ``decrypt_into``), through buffers reused per put and per thread.
* **Sizes.** The plaintext size is not stored: ``put`` streams and does not know
  it up front. It follows exactly from the object's size, ``head`` reports it
  without reading anything (one ``head`` of the inner tier), and ``list`` has no
  sizes to translate. An object whose size no plaintext can produce is damaged.
* **Ranged reads** (``get`` with a range, ``read_into``) fetch and decrypt only
  the chunks they overlap (plus the 80-byte header).
* **No rename.** The name is bound into every chunk, so ``atomic_rename`` is
  false and the commit protocol uses the object-store path (data under the final
  prefix, manifest last with a create-only put) on any inner tier.

Errors: a chunk that fails authentication raises
:class:`~mouthguard.errors.AuthenticationError` (a ``ChecksumMismatchError``:
``load`` falls back and the copy is repaired from an intact one); an unknown or
wrong key, a foreign object or another chunk size raises
:class:`~mouthguard.errors.EncryptionKeyError` (a ``TierError``: the copy is
skipped but never condemned). Neither message, nor ``repr``, ever contains a key.
"""

from __future__ import annotations

import builtins
import dataclasses
import os
import struct
import threading
from collections.abc import Iterator, Mapping

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from typing_extensions import override

from mouthguard.errors import AuthenticationError, ConfigError, EncryptionKeyError, TierError
from mouthguard.tiers.base import ObjectInfo, PutData, PutMode, Tier, TierCapabilities, iter_buffers
from mouthguard.tiers.key_material import parse_keyring, validate_key_id
from mouthguard.tiers.object_keys import validate_key
from mouthguard.tiers.wrapper import WrappedTier

MAGIC = b"MGCRYPT"
VERSION = 1
#: Plaintext bytes per chunk (the default; recorded in every object's header).
CHUNK_BYTES = 1024 * 1024
TAG_BYTES = 16
KEY_BYTES = 32
_HEADER = struct.Struct("<7sBB32sI16s7s8s4x")
HEADER_BYTES = _HEADER.size  # 80
_INFO = b"mouthguard.encrypted-tier.v1"
_MAX_CHUNKS = 1 << 32
#: ``encrypt_into``/``decrypt_into`` (no extra copy) exist in newer cryptography releases.
_HAS_INTO = hasattr(AESGCM, "decrypt_into") and hasattr(AESGCM, "encrypt_into")


@dataclasses.dataclass(frozen=True)
class _Header:
    raw: bytes
    key_id: str
    chunk_size: int
    salt: bytes
    prefix: bytes
    check: bytes


def ciphertext_size(plain: int, chunk: int = CHUNK_BYTES) -> int:
    """Stored size of a ``plain``-byte object: header, ``plain // chunk + 1`` sealed chunks."""
    return HEADER_BYTES + plain + TAG_BYTES * (plain // chunk + 1)


def plaintext_size(stored: int, chunk: int = CHUNK_BYTES) -> int | None:
    """Plaintext size of a ``stored``-byte object, or None if no plaintext has that size."""
    body = stored - HEADER_BYTES - TAG_BYTES  # without the header and the last chunk's tag
    if body < 0:
        return None
    full, rest = divmod(body, chunk + TAG_BYTES)
    return full * chunk + rest if rest < chunk else None


class EncryptedTier(WrappedTier):
    """Wraps ``inner`` so that every object is stored AES-256-GCM encrypted (see the module).

    Args:
        inner: the tier that stores the ciphertext.
        key: the 32-byte master key that encrypts new objects.
        key_id: its name, written into every object (1-32 of ``[A-Za-z0-9._-]``).
        old_keys: more keys by id, accepted for reading (key rotation).
        chunk_size: plaintext bytes per authenticated chunk (default 1 MiB).

    Raises:
        ValueError: a key is not 32 bytes, or the chunk size is out of range.
        ConfigError: a key id is invalid.
    """

    def __init__(
        self,
        inner: Tier,
        key: bytes,
        *,
        key_id: str,
        old_keys: Mapping[str, bytes] | None = None,
        chunk_size: int = CHUNK_BYTES,
    ) -> None:
        super().__init__(inner)
        keys = {**(old_keys or {}), validate_key_id(key_id): bytes(key)}
        for kid, material in keys.items():
            validate_key_id(kid)
            if len(material) != KEY_BYTES:
                raise ValueError(f"key {kid!r} must be {KEY_BYTES} bytes, got {len(material)}")
        if not 1 <= chunk_size <= 64 * CHUNK_BYTES:
            raise ValueError(f"chunk_size must be between 1 B and 64 MiB, got {chunk_size}")
        self.key_id = key_id
        self.chunk_size = chunk_size
        self._keys = keys

    # --- what the wrapper changes ------------------------------------------------

    @property
    @override
    def capabilities(self) -> TierCapabilities:
        """The inner tier's, without rename: the object name is bound into its ciphertext."""
        return dataclasses.replace(self.inner.capabilities, atomic_rename=False)

    @override
    def put(self, key: str, data: PutData, *, mode: PutMode = PutMode.OVERWRITE) -> ObjectInfo:
        """Encrypt ``data`` chunk by chunk while streaming it to the inner tier."""
        validate_key(key)
        salt, prefix = os.urandom(16), os.urandom(7)
        aead, check = self._derive(self._keys[self.key_id], salt)
        kid = self.key_id.encode()
        header = _HEADER.pack(MAGIC, VERSION, len(kid), kid, self.chunk_size, salt, prefix, check)
        cipher = _ObjectCipher(aead, header, prefix, key.encode())
        counter = [0]
        info = self.inner.put(key, self._encrypting(cipher, data, counter), mode=mode)
        return dataclasses.replace(info, size=counter[0])

    def _encrypting(
        self, cipher: _ObjectCipher, data: PutData, plain_total: builtins.list[int]
    ) -> Iterator[memoryview | bytes]:
        """Header, then sealed chunks; full chunks never look ahead (the last one is short)."""
        yield cipher.header
        size = self.chunk_size
        sealed = memoryview(bytearray(size + TAG_BYTES))  # reused: the tier consumes each chunk
        pending = bytearray()  # a chunk's bytes spread over several of the caller's buffers
        index = 0
        for view in iter_buffers(data):
            plain_total[0] += view.nbytes
            pos = 0
            if pending:
                pos = min(size - len(pending), view.nbytes)
                pending += view[:pos]
                if len(pending) < size:
                    continue
                yield cipher.seal_into(index, pending, sealed, last=False)
                index += 1
                pending.clear()
            while view.nbytes - pos >= size:
                yield cipher.seal_into(index, view[pos : pos + size], sealed, last=False)
                index += 1
                pos += size
            pending += view[pos:]
        yield cipher.seal_into(index, pending, sealed[: len(pending) + TAG_BYTES], last=True)

    @override
    def get(self, key: str, start: int = 0, end: int | None = None) -> bytes:
        """Bytes ``[start, end)`` of the plaintext; only the chunks they touch are read."""
        validate_key(key)
        info = self.inner.head(key)
        plain = self._plain_size(key, info.size)
        stop = plain if end is None else end
        self._check_range(key, start, stop, plain)
        out = bytearray(stop - start)
        self._read_retrying(key, start, memoryview(out), info.size)
        return bytes(out)

    @override
    def read_into(self, key: str, offset: int, out: memoryview) -> None:
        """Fill ``out`` with plaintext from ``offset``, decrypting straight into it."""
        validate_key(key)
        view = out.cast("B") if out.format != "B" or out.ndim != 1 else out
        info = self.inner.head(key)
        plain = self._plain_size(key, info.size)
        self._check_range(key, offset, offset + view.nbytes, plain)
        self._read_retrying(key, offset, view, info.size)

    @override
    def head(self, key: str) -> ObjectInfo:
        """The plaintext size, computed from the stored size (nothing is read).

        A stored size that no plaintext produces (a damaged object) is reported
        as the nearest plausible size; reading the object fails authentication.
        """
        return self._plain_info(self.inner.head(key))

    @override
    def list_info(self, prefix: str = "") -> Iterator[ObjectInfo]:
        """The inner listing with plaintext sizes, as :meth:`head` computes them.

        The ``etag`` is the inner tier's (of the ciphertext): every write draws a
        new salt, so it changes whenever the object is written again.
        """
        return map(self._plain_info, self.inner.list_info(prefix))

    def _plain_info(self, info: ObjectInfo) -> ObjectInfo:
        plain = plaintext_size(info.size, self.chunk_size)
        if plain is None:
            full = max(info.size - HEADER_BYTES - TAG_BYTES, 0) // (self.chunk_size + TAG_BYTES)
            plain = (full + 1) * self.chunk_size - 1
        return dataclasses.replace(info, size=plain)

    # --- reading ------------------------------------------------------------------

    def _plain_size(self, key: str, stored: int) -> int:
        plain = plaintext_size(stored, self.chunk_size)
        if plain is None:
            raise AuthenticationError(
                f"{key} on tier {self.name!r}: encrypted object has an impossible size "
                f"({stored} bytes): truncated or extended"
            )
        return plain

    def _check_range(self, key: str, start: int, stop: int, plain: int) -> None:
        if not 0 <= start <= stop <= plain:
            raise TierError(
                f"range [{start}, {stop}) is outside {key} ({plain} bytes) on tier {self.name!r}"
            )

    def _read_retrying(self, key: str, start: int, out: memoryview, stored: int) -> None:
        """Read once more if authentication failed because the object was replaced meanwhile.

        Size, header and chunks come from separate requests; an overwrite between
        them (sidecars are overwritten) mixes two objects. Only a failure on an
        object that did not change is reported.
        """
        try:
            self._read(key, start, out, stored)
        except AuthenticationError:
            again = self.inner.head(key).size
            if again == stored:
                raise
            plain = self._plain_size(key, again)
            self._check_range(key, start, start + out.nbytes, plain)
            self._read(key, start, out, again)

    def _read(self, key: str, start: int, out: memoryview, stored: int) -> None:
        """Decrypt plaintext ``[start, start + len(out))`` into ``out`` (range checked)."""
        if not out.nbytes:
            return
        size, step = self.chunk_size, self.chunk_size + TAG_BYTES
        final = (stored - HEADER_BYTES - TAG_BYTES) // step  # index of the short last chunk
        stop = start + out.nbytes
        first, last = start // size, (stop - 1) // size
        hi = min(HEADER_BYTES + (last + 1) * step, stored)
        lo = 0 if first == 0 else HEADER_BYTES + first * step
        blob = _scratch(hi - lo)
        self.inner.read_into(key, lo, blob)
        if first == 0:
            raw_header, body = bytes(blob[:HEADER_BYTES]), blob[HEADER_BYTES:]
        else:
            raw_header, body = self.inner.get(key, 0, HEADER_BYTES), blob
        header = self._parse_header(key, raw_header)
        aead, check = self._derive(self._keys[header.key_id], header.salt)
        if check != header.check:
            raise EncryptionKeyError(
                f"{key} on tier {self.name!r}: key {header.key_id!r} is not the key it was "
                "encrypted with (wrong key configured under that id)"
            )
        cipher = _ObjectCipher(aead, header.raw, header.prefix, key.encode())
        for n, index in enumerate(range(first, last + 1)):
            sealed = body[n * step : (n + 1) * step]
            base = index * size
            lo_in, hi_in = max(start - base, 0), min(stop - base, sealed.nbytes - TAG_BYTES)
            whole = lo_in == 0 and hi_in == sealed.nbytes - TAG_BYTES
            dest = out[base + lo_in - start : base + hi_in - start] if whole else None
            try:
                chunk = cipher.open_into(index, sealed, dest, last=index == final)
            except InvalidTag:
                raise AuthenticationError(
                    f"{key} on tier {self.name!r}: encrypted chunk {index} fails authentication "
                    "(tampered, swapped, truncated or damaged)"
                ) from None
            if dest is None:
                out[base + lo_in - start : base + hi_in - start] = chunk[lo_in:hi_in]

    def _parse_header(self, key: str, raw: bytes) -> _Header:
        where = f"{key} on tier {self.name!r}"
        if len(raw) != HEADER_BYTES:
            raise AuthenticationError(f"{where}: encrypted header is truncated")
        magic, version, kid_len, kid_raw, chunk, salt, prefix, check = _HEADER.unpack(raw)
        if magic != MAGIC:
            raise EncryptionKeyError(f"{where}: not an object of an encrypted tier (bad magic)")
        if version != VERSION:
            raise EncryptionKeyError(f"{where}: unsupported encrypted format version {version}")
        if chunk != self.chunk_size:
            raise EncryptionKeyError(
                f"{where}: encrypted with {chunk}-byte chunks, this tier uses {self.chunk_size}"
            )
        kid = kid_raw[: min(kid_len, len(kid_raw))].decode("ascii", errors="replace")
        if kid not in self._keys:
            raise EncryptionKeyError(
                f"{where}: encrypted with key id {kid!r}, which is not configured "
                f"(configured: {sorted(self._keys)})"
            )
        return _Header(raw, kid, chunk, salt, prefix, check)

    @staticmethod
    def _derive(master: bytes, salt: bytes) -> tuple[AESGCM, bytes]:
        okm = HKDF(algorithm=hashes.SHA256(), length=KEY_BYTES + 8, salt=salt, info=_INFO).derive(
            master
        )
        return AESGCM(okm[:KEY_BYTES]), okm[KEY_BYTES:]

    # --- everything else is forwarded unchanged (WrappedTier), except renames -------

    @override
    def rename_prefix(self, src: str, dst: str) -> None:
        """Refused: every chunk is bound to its object's name, so nothing can move."""
        Tier.rename_prefix(self, src, dst)

    @override
    def __repr__(self) -> str:
        return f"EncryptedTier({self.inner!r}, key_id={self.key_id!r})"


@dataclasses.dataclass(frozen=True)
class _ObjectCipher:
    """One object's AEAD with its header, nonce prefix and name (see the module docstring)."""

    aead: AESGCM
    header: bytes
    prefix: bytes
    name: bytes

    def _nonce_aad(self, index: int, last: bool) -> tuple[bytes, bytes]:
        if index >= _MAX_CHUNKS:
            raise TierError("object too large for the encrypted format (2**32 chunks)")
        flag = b"\x01" if last else b"\x00"
        nonce = self.prefix + index.to_bytes(4, "big") + flag
        return nonce, self.header + index.to_bytes(8, "big") + flag + self.name

    def seal_into(
        self, index: int, plain: memoryview | bytearray, out: memoryview, *, last: bool
    ) -> memoryview:
        """Encrypt chunk ``index`` into ``out`` (``len(plain) + 16`` bytes); return that view."""
        nonce, aad = self._nonce_aad(index, last)
        target = out[: len(plain) + TAG_BYTES]
        if _HAS_INTO:
            self.aead.encrypt_into(nonce, plain, aad, target)
        else:  # cryptography < 45: one more copy
            target[:] = self.aead.encrypt(nonce, bytes(plain), aad)
        return target

    def open_into(
        self, index: int, sealed: memoryview, out: memoryview | None, *, last: bool
    ) -> memoryview:
        """Decrypt chunk ``index`` into ``out`` (or a scratch buffer); ``InvalidTag`` if forged."""
        nonce, aad = self._nonce_aad(index, last)
        target = out if out is not None else memoryview(bytearray(sealed.nbytes - TAG_BYTES))
        if _HAS_INTO:
            self.aead.decrypt_into(nonce, sealed, aad, target)
        else:  # cryptography < 45: one more copy
            target[:] = self.aead.decrypt(nonce, bytes(sealed), aad)
        return target


_local = threading.local()


def _scratch(nbytes: int) -> memoryview:
    """A per-thread buffer of at least ``nbytes`` reused across reads (no page faults)."""
    buf: bytearray | None = getattr(_local, "buf", None)
    if buf is None or len(buf) < nbytes:
        buf = _local.buf = bytearray(nbytes)
    return memoryview(buf)[:nbytes]


def encrypted_from_env(inner: Tier, variable: str) -> EncryptedTier:
    """Wrap ``inner`` with the keys in environment variable ``variable`` (first: current).

    Raises:
        ConfigError: the variable is unset, or its keys are malformed or not 32 bytes.
            The message names the variable, never its value.
    """
    value = os.environ.get(variable, "")
    if not value.strip():
        raise ConfigError(
            f"tier {inner.name!r}: encryption_key_env names ${variable}, which is not set"
        )
    ring = parse_keyring(value, f"${variable}", exact_bytes=KEY_BYTES)
    old = {kid: key for kid, key in ring.keys.items() if kid != ring.current}
    return EncryptedTier(inner, ring.current_key, key_id=ring.current, old_keys=old)
