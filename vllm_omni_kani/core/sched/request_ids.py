"""The request ids a scheduler's ``finish_requests`` names, in one form."""

from __future__ import annotations

from collections.abc import Iterable


def as_request_ids(request_ids: str | Iterable[str] | None) -> Iterable[str] | None:
    """vLLM's ``finish_requests`` takes one id, several, or None (every request): ids to iterate, or None for all."""
    if request_ids is None:
        return None
    return (request_ids,) if isinstance(request_ids, str) else request_ids
