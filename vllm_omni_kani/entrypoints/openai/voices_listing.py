"""``GET /v1/audio/voices`` also lists a Kani checkpoint's language tags.

vLLM-Omni 0.26's listing has the speakers and uploaded voices only, yet a multilingual Kani checkpoint refuses any
``language`` outside its ``language_settings`` tags: a client should be able to ask which ones exist. The route keeps
vLLM-Omni's handler and response; for a Kani model it adds ``"languages": [...]`` (the checkpoint's spelling, empty
when it has no tags). Other models' responses are untouched.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Request
from starlette.responses import JSONResponse, Response

from vllm_omni_kani.entrypoints.openai.tts_adapters.kani_tts import MODEL_TYPE

VOICES_PATH = "/v1/audio/voices"
LANGUAGES_KEY = "languages"


def kani_languages(state: Any) -> list[str] | None:
    """The served Kani checkpoint's language tags; None when the speech model is not Kani."""
    handler = getattr(state, "openai_serving_speech", None)
    adapter = getattr(handler, "_adapter", None)
    settings = getattr(adapter, "settings", None)
    if adapter is None or getattr(adapter, "name", None) != MODEL_TYPE or settings is None:
        return None
    return list(settings.languages)


def install(app: Any) -> None:
    """Put the listing on a freshly built app, ahead of vLLM-Omni's own route for the same path (included after
    the app is built; the first route that matches serves the request)."""
    from vllm_omni.entrypoints.openai import api_server

    list_voices = api_server.list_voices

    async def list_voices_and_languages(raw_request: Request) -> Response:
        response = await list_voices(raw_request)
        languages = kani_languages(raw_request.app.state)
        if languages is None or response.status_code != 200 or not isinstance(response, JSONResponse):
            return response
        return JSONResponse(content={**json.loads(response.body), LANGUAGES_KEY: languages})

    list_voices_and_languages.__doc__ = list_voices.__doc__
    app.add_api_route(VOICES_PATH, list_voices_and_languages, methods=["GET"], tags=["audio"])
