"""Keeping secrets out of journals, records and logs.

Two nets: the exact values of the secrets a deployment names (HF_TOKEN...), and patterns for
anything shaped like a token, so that a secret nobody declared is still caught.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

MASK = "***"

# Each pattern either is the secret as a whole, or keeps group 1 (a label) and masks the rest.
TOKEN_PATTERNS = [
    re.compile(r"hf_[A-Za-z0-9]{30,}"),
    re.compile(r"sk-[A-Za-z0-9_\-]{20,}"),
    re.compile(r"gh[pousr]_[A-Za-z0-9]{30,}"),
    re.compile(r"github_pat_[A-Za-z0-9_]{40,}"),
    re.compile(r"xox[abprs]-[A-Za-z0-9\-]{10,}"),
    re.compile(r"AKIA[0-9A-Z]{16}"),
    # These two start at a word's start, and a key's block ends before the next key: each try
    # then scans its own part of the text, not the rest of it (linear in a long value). "[ ]"
    # keeps the key's marker out of secret scans of this source.
    re.compile(r"(?<![A-Za-z0-9_\-])eyJ[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}\.[A-Za-z0-9_\-]{8,}"),
    re.compile(
        r"-----BEGIN [A-Z ]*PRIVATE[ ]KEY-----(?:(?!-----BEGIN )[\s\S])*?"
        r"-----END [A-Z ]*PRIVATE[ ]KEY-----"
    ),
    re.compile(r"(?i)(bearer\s+)[A-Za-z0-9._~+/\-]{12,}=*"),
    re.compile(r"(--api-key[= ]\s*)['\"]?[^\s'\"]+"),
    # A value under a secret-named key in a repr or JSON: {'bearer': '...'}, "api_key": "..."
    re.compile(
        r"(?i)(['\"](?:bearer|authorization|api[_-]?key|token|password|secret)['\"]\s*:\s*['\"])"
        r"[^'\"]{4,}"
    ),
    # Starts only where a name starts: tried at every letter of a long word, the name's
    # backtracking made a 100 kB value take minutes (issue 32, item 5).
    re.compile(
        r"(?i)(?<![A-Z0-9_])"
        r"((?:[A-Z0-9_]*(?:TOKEN|API_KEY|APIKEY|SECRET|PASSWORD|PASSWD))['\"]?\s*[=:]\s*['\"]?)"
        r"[^\s'\";]{6,}"
    ),
]

MIN_SECRET_LENGTH = 4


class Redactor:
    """Replaces known secret values and token-shaped strings with ``***``."""

    def __init__(self, secrets: Iterable[str] = ()):
        self._values: set[str] = set()
        for value in secrets:
            self.add(value)

    def add(self, value: str) -> None:
        """Treat ``value`` as secret from now on (too short a value would mask ordinary text)."""
        if value and len(value) >= MIN_SECRET_LENGTH:
            self._values.add(value)

    def redact(self, text: str) -> str:
        # Longest first, so that a secret containing another is masked whole.
        for value in sorted(self._values, key=len, reverse=True):
            text = text.replace(value, MASK)
        for pattern in TOKEN_PATTERNS:
            text = pattern.sub(_mask_match, text)
        return text


def _mask_match(match: re.Match[str]) -> str:
    label = match.group(1) if match.re.groups else ""
    return f"{label}{MASK}"
