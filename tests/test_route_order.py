"""The speech route first in the served app (``entrypoints/openai/route_order.py``): every request is answered by
the route that answered it before, and nothing is moved past a route that could answer the speech path."""

from __future__ import annotations

import json
import re

from starlette.routing import Match, Mount, Route

from tests.conftest import benchmark_script, run_benchmark_script
from vllm_omni_kani.entrypoints.openai.route_order import reorder, speech_first
from vllm_omni_kani.entrypoints.openai.speech_guard import SPEECH_PATH


def _requests(routes):
    """One (path, method) per route and method, path parameters filled in."""
    for route in routes:
        if not isinstance(route, Route):
            continue
        path = re.sub(r"\{[^}]+\}", "x", route.path)
        for method in sorted(route.methods or {"GET"}):
            yield path, method


def _answering(routes, path, method):
    """The route Starlette's router serves the request with: the first full match, else the first partial one."""
    partial = None
    scope = {"type": "http", "path": path, "root_path": "", "method": method}
    for route in routes:
        match = route.matches(scope)[0]
        if match == Match.FULL:
            return route
        if match == Match.PARTIAL and partial is None:
            partial = route
    return partial


def test_the_speech_route_goes_first_and_every_request_keeps_its_route():
    app = benchmark_script("route_walk").served_app()
    before = list(app.router.routes)
    speech = [r for r in before if getattr(r, "path", None) == SPEECH_PATH]
    assert speech and before.index(speech[0]) > 0, "vLLM-Omni includes its router after vLLM's routes"
    requests = set(_requests(before)) | {(SPEECH_PATH, "GET"), ("/v1/audio/speech/batch", "POST")}
    answers = {request: _answering(before, *request) for request in requests}

    speech_first(app, SPEECH_PATH)

    assert app.router.routes[: len(speech)] == speech
    assert sorted(map(id, app.router.routes)) == sorted(map(id, before))  # nothing added or lost
    for request, route in answers.items():
        assert _answering(app.router.routes, *request) is route, request


async def _noop(request):  # pragma: no cover - never called
    raise AssertionError


class _NoopApp:  # pragma: no cover - never called
    async def __call__(self, scope, receive, send):
        raise AssertionError


_noop_app = _NoopApp()


def test_nothing_moves_past_a_route_that_could_answer_the_path():
    mount = Mount("/v1", routes=[])
    literal = [Route("/health", _noop), Route(SPEECH_PATH, _noop, methods=["POST"])]
    assert reorder(routes := [mount, *literal], SPEECH_PATH) == 0
    assert routes == [mount, *literal]

    other_method = Route(SPEECH_PATH, _noop, methods=["GET"])  # the path's routes move together, in their order
    assert reorder(routes := [literal[0], other_method, literal[1]], SPEECH_PATH) == 2
    assert routes == [other_method, literal[1], literal[0]]

    pattern = Route("/v1/audio/{kind}", _noop, methods=["POST"])
    assert reorder(routes := [pattern, *literal], SPEECH_PATH) == 0

    get_only = Route("/v1/audio/{kind}", _noop, methods=["GET"])
    assert reorder(routes := [get_only, *literal], SPEECH_PATH) == 1
    assert routes == [literal[1], get_only, literal[0]]

    # A second registration equal to the moved route (same path, endpoint, methods) but behind a mount stays, in place.
    again = Route(SPEECH_PATH, _noop, methods=["POST"])
    assert again == literal[1] and again is not literal[1]
    assert reorder(routes := [*literal, mount, again], SPEECH_PATH) == 1
    assert [id(r) for r in routes] == [id(r) for r in (literal[1], literal[0], mount, again)]


def test_a_path_parameter_route_an_any_method_route_or_a_missing_path_moves_nothing():
    parametrised = "/v1/audio/speech/{request_id}"
    routes = [Route("/health", _noop), Route(parametrised, _noop, methods=["POST"])]
    assert reorder(routes, parametrised) == 0
    assert reorder(routes, SPEECH_PATH) == 0
    assert [r.path for r in routes] == ["/health", parametrised]
    any_method = Route(SPEECH_PATH, _noop_app)  # an ASGI app endpoint: every method
    assert any_method.methods is None
    assert reorder(routes := [Route("/health", _noop), any_method], SPEECH_PATH) == 0


def test_the_route_walk_benchmark_runs_both_sides(tmp_path):
    out = tmp_path / "route-walk.json"
    run_benchmark_script("route_walk", "--requests", 50, "--rounds", 1, "--json", out)
    result = json.loads(out.read_text())
    assert result["speech_index"]["as_built"] > 0 and result["speech_index"]["speech_first"] == 0
    for side in ("as_built", "speech_first"):
        assert all(value > 0 for value in result["us_per_request"][side].values())
