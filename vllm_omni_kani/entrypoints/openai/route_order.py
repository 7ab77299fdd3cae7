"""The speech route first in the served app's route list.

Starlette finds a request's route by trying the app's routes in order, and vLLM's Prometheus instrumentation walks
the same list once more to name the route in its metrics. vLLM-Omni includes its router after vLLM's own routes,
so every ``POST /v1/audio/speech`` was tried against ~18 routes twice before it matched: ~35 µs of the API server's
event loop a request on a 2-core CPU (``benchmarks/route_walk.py``: 38.0 -> 3.5 µs), the thread that takes in every
request and streams every answer.

Moving a route to the front changes which route answers a request only where an earlier route also matches it;
``reorder`` moves a literal path's route only when no route before it matches that path (Starlette's own
``matches``, for each of the route's methods) or has that path, and keeps the moved routes in their relative order.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.routing import Match, Route

logger = logging.getLogger(__name__)


def _could_serve(earlier: Any, moved: Route) -> bool:
    """Whether ``earlier`` answers some request for ``moved``'s literal path today: it fully matches it for one of
    ``moved``'s methods (Starlette's own ``matches``), or it is a route for the same path (which would answer a
    method neither has)."""
    if getattr(earlier, "path", None) == moved.path:
        return True
    for method in moved.methods:
        scope = {"type": "http", "path": moved.path, "root_path": "", "method": method}
        if earlier.matches(scope)[0] == Match.FULL:
            return True
    return False


def reorder(routes: list[Any], path: str) -> int:
    """Move the routes for ``path`` to the front of ``routes`` (in place), keeping their relative order.

    A route is moved only when no route before it could serve one of its requests. Returns how many moved.
    """
    moving: list[Any] = []
    for index, route in enumerate(routes):
        if getattr(route, "path", None) != path:
            continue
        if not isinstance(route, Route) or route.param_convertors or not route.methods:
            break  # only a literal path's route with its methods is moved: the requests it serves are known
        moved = {id(r) for r in moving}  # by identity: Starlette's routes compare equal by path, endpoint and methods
        if any(_could_serve(earlier, route) for earlier in routes[:index] if id(earlier) not in moved):
            break
        moving.append(route)
    if not moving:
        return 0
    moved = {id(r) for r in moving}
    routes[:] = moving + [route for route in routes if id(route) not in moved]
    return len(moving)


def speech_first(app: Any, path: str) -> None:
    """Put ``path``'s routes first in ``app``'s router (after vLLM-Omni has included its own)."""
    moved = reorder(app.router.routes, path)
    if moved:
        logger.info("routes: %s first (%d moved) of %d", path, moved, len(app.router.routes))
    else:
        logger.info("routes: %s left where it is (a route before it could answer it)", path)
