"""vLLM-Omni plugin serving Kani-style text-to-speech as a two-stage pipeline.

``register()`` is the ``vllm.general_plugins`` entry point: vLLM calls it in every process
(API server, engine cores, workers), so it is idempotent and imports nothing heavy until the
things it registers are actually used.
"""

from __future__ import annotations

__version__ = "0.1.0"

_registered = False

_KANI = "vllm_omni_kani.model_executor.models.kani_tts"
# Architecture → lazily imported class, registered with vLLM and vLLM-Omni alike.
MODELS = {
    "ParallelHeadLfm2ForCausalLM": f"{_KANI}.kani_tts_lm:ParallelHeadLfm2ForCausalLM",
    "KaniFlattenedLfm2ForCausalLM": f"{_KANI}.kani_tts_lm:KaniFlattenedLfm2ForCausalLM",
    "KaniTTS2ForCausalLM": f"{_KANI}.kani_tts_lm:KaniTTS2ForCausalLM",
    "KaniNanoCodecForGeneration": f"{_KANI}.codec_stage:KaniNanoCodecForGeneration",
}


def register() -> None:
    """Register models, pipelines and the TTS adapter with vLLM / vLLM-Omni; apply guarded patches."""
    global _registered
    if _registered:
        return
    _registered = True
    from vllm_omni_kani import gc_threshold, gil_switch, inductor_patch, jit_events, logger, lora_patch, patch

    logger.route_to_vllm()
    gil_switch.apply_switch_interval()
    gc_threshold.apply_gc_threshold()
    jit_events.install()

    patch.apply_all()
    lora_patch.apply_all()
    inductor_patch.apply_all()
    _register_models()
    _register_pipelines()


def _register_models() -> None:
    from vllm import ModelRegistry
    from vllm_omni.model_executor.models import OmniModelRegistry

    # Two registries: vLLM's validates the config, vLLM-Omni's resolves the class at load.
    for registry in (ModelRegistry, OmniModelRegistry):
        known = set(registry.get_supported_archs())
        for arch, target in MODELS.items():
            if arch not in known:
                registry.register_model(arch, target)


def _register_pipelines() -> None:
    from vllm_omni.config.pipeline_registry import OMNI_PIPELINES, register_pipeline

    from vllm_omni_kani.model_executor.models.kani_tts import pipeline

    for key, resolver in (
        (pipeline.PIPELINE_KEY, pipeline.resolve_pipeline),
        (pipeline.LM_ONLY_PIPELINE_KEY, pipeline.resolve_lm_only_pipeline),
    ):
        if key not in OMNI_PIPELINES:
            register_pipeline(resolver, model_type=key)
