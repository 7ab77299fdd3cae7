"""Per-request scheduler state forgotten for the ids a scheduler's ``finish_requests`` names."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any


def forget_requests(by_id: dict[str, Any], request_ids: str | Iterable[str] | None) -> None:
    """Remove ``request_ids``' entries from ``by_id``: one id, several, or None (every request), as vLLM's
    ``finish_requests`` takes them; ids without an entry are skipped."""
    if request_ids is None:
        by_id.clear()
        return
    for request_id in (request_ids,) if isinstance(request_ids, str) else request_ids:
        by_id.pop(request_id, None)


def external_ids(request_ids: str | Iterable[str] | None, requests: Mapping[str, Any] | None) -> set[str]:
    """The external ids (a connector's keys) of the requests ``finish_requests`` names: one id, several, or None (every
    request in ``requests``). An id the scheduler no longer holds stands for itself: an abort names a request its stage
    has already finished by that id. Pass a materialised ``request_ids`` where the caller reads it again."""
    known = requests or {}
    ids = known if request_ids is None else (request_ids,) if isinstance(request_ids, str) else request_ids
    return {getattr(known.get(i), "external_req_id", None) or i for i in ids}
