"""Per-request scheduler state forgotten for the ids a scheduler's ``finish_requests`` names."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def forget_requests(by_id: dict[str, Any], request_ids: str | Iterable[str] | None) -> None:
    """Remove ``request_ids``' entries from ``by_id``: one id, several, or None (every request), as vLLM's
    ``finish_requests`` takes them; ids without an entry are skipped."""
    if request_ids is None:
        by_id.clear()
        return
    for request_id in (request_ids,) if isinstance(request_ids, str) else request_ids:
        by_id.pop(request_id, None)
