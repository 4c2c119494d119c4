"""Verification receipts: sidecars recording that a copy was read back and matched.

A receipt names the manifest checksum it vouches for, so a receipt left next to
a manifest that was later replaced (or forged) vouches for nothing. Receipts are
advisory facts for operators (``show`` reports them); ``load()`` never trusts a
receipt instead of checking bytes.
"""

from __future__ import annotations

import datetime as dt
import json

from mouthguard.checkpoint.catalog import checkpoint_prefix, manifest_key
from mouthguard.errors import MouthguardError
from mouthguard.format.checksum import xxh3_digest
from mouthguard.tiers.base import PutMode, Tier

RECEIPT_NAME = "sidecar.verified.json"


def write_receipt(
    tier: Tier, run: str, step: int, manifest_bytes: bytes, when: dt.datetime
) -> None:
    """Record on ``tier`` that its copy of ``run``/``step`` verified at ``when``."""
    body = {
        "manifest": xxh3_digest(manifest_bytes),
        "verified_at": when.isoformat(),
        "tier": tier.name,
    }
    tier.put(
        checkpoint_prefix(run, step) + RECEIPT_NAME,
        json.dumps(body).encode(),
        mode=PutMode.OVERWRITE,
    )


def read_receipt(tier: Tier, run: str, step: int) -> dt.datetime | None:
    """When the copy's current manifest was last verified on ``tier``, if ever."""
    try:
        body = json.loads(tier.get(checkpoint_prefix(run, step) + RECEIPT_NAME))
        manifest = tier.get(manifest_key(run, step))
        if not isinstance(body, dict) or body.get("manifest") != xxh3_digest(manifest):
            return None
        return dt.datetime.fromisoformat(str(body["verified_at"]))
    except (MouthguardError, ValueError, KeyError, TypeError):
        return None
