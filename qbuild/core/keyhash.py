"""The one hash behind every action key: SHA-256 of the key parts' canonical JSON.

Keys are computed by ``keys`` (a target's parts, a declared action's parts) and checked
again by ``store.gate`` on every entry it reads; both call ``key_hash``, so the gate can
never recompute a key differently from the keyer that made it. Canonical JSON: keys
sorted, no spaces, UTF-8 as is (``ensure_ascii=False``).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# One encoder, made once: ``json.dumps`` with any option builds a new encoder per call,
# which costs as much as encoding a key's parts.
canonical_json = json.JSONEncoder(sort_keys=True, separators=(",", ":"),
                                  ensure_ascii=False).encode
"""``json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)``"""


def key_hash(parts: Any) -> str:
    """The action key of ``parts``: SHA-256 (hex) of their canonical JSON."""
    return hashlib.sha256(canonical_json(parts).encode("utf-8")).hexdigest()


__all__ = ["canonical_json", "key_hash"]
