"""Kani TTS topology: Stage 0 (LFM2 LM, one frame per step or four tokens per frame) →
async_chunk → Stage 1 (NanoCodec decoder, final audio).

The variant is read from the checkpoint: a resolver returns the parallel-head or the
flattened pipeline, or None for anything that is not a Kani checkpoint (it is consulted for
other models too, so it never raises). Capacity knobs live in ``stage_configs/*.yaml``.
"""

from __future__ import annotations

from typing import Any

from vllm_omni.config.stage_config import PipelineConfig, StageExecutionType, StagePipelineConfig

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import (
    FLATTENED_ARCH,
    FLATTENED_STAGE_ARCH,
    PARALLEL_ARCH,
    V2_ARCH,
    KaniTTSSettings,
)

PIPELINE_KEY = "kani_tts"
LM_ONLY_PIPELINE_KEY = "kani_tts_lm"
# Serving recognises the TTS stage by this name.
LM_STAGE = "kani_tts"
CODEC_STAGE = "kani_codec"

# Architectures the stages run under (registered by vllm_omni_kani.register()).
STAGE0_ARCH = {"parallel": PARALLEL_ARCH, "flattened": FLATTENED_STAGE_ARCH}
CODEC_ARCH = "KaniNanoCodecForGeneration"
# Stage 1's steps are bounded in codec frames, first chunks first (codec_step_max_frames).
CODEC_SCHEDULER = "vllm_omni_kani.core.sched.codec_scheduler.KaniCodecScheduler"
# Stage 0 feeding the codec sends each stream's outputs every few steps (kani_output_every_steps); alone (final) it
# keeps vLLM-Omni's scheduler, whose every step reaches the client.
STAGE0_SCHEDULER = "vllm_omni_kani.core.sched.stage0_scheduler.KaniStage0Scheduler"

_PROC = "vllm_omni_kani.model_executor.stage_input_processors.kani_tts"
_LM_CONSTRAINTS = {"detokenize": False, "stop_token_ids": [tl.END_OF_SPEECH]}


def is_kani_config(hf_config: Any) -> bool:
    try:
        KaniTTSSettings.from_hf_config(hf_config)
    except Exception:
        return False
    return True


def _lm_stage(variant: str, *, final: bool) -> StagePipelineConfig:
    return StagePipelineConfig(
        stage_id=0,
        model_stage=LM_STAGE,
        execution_type=StageExecutionType.LLM_AR,
        input_sources=(),
        owns_tokenizer=True,
        final_output=final,
        final_output_type="text" if final else None,
        # Not "text": a per-step payload is what drives the async_chunk producer.
        engine_output_type="latent" if not final else "audio",
        model_arch=STAGE0_ARCH[variant],
        async_chunk_process_next_stage_input_func=None if final else f"{_PROC}.{variant}_async_chunk",
        scheduler_cls=None if final else STAGE0_SCHEDULER,
        sampling_constraints=dict(_LM_CONSTRAINTS),
    )


def _two_stage(variant: str) -> PipelineConfig:
    return PipelineConfig(
        model_type=PIPELINE_KEY,
        hf_architectures=(PARALLEL_ARCH,) if variant == "parallel" else (FLATTENED_ARCH, V2_ARCH),
        hf_config_predicate=is_kani_config,
        stages=(
            _lm_stage(variant, final=False),
            StagePipelineConfig(
                stage_id=1,
                model_stage=CODEC_STAGE,
                execution_type=StageExecutionType.LLM_GENERATION,
                input_sources=(0,),
                final_output=True,
                final_output_type="audio",
                engine_output_type="audio",
                model_arch=CODEC_ARCH,
                scheduler_cls=CODEC_SCHEDULER,
                sync_process_input_func=f"{_PROC}.{variant}_sync_inputs",
                sampling_constraints={"detokenize": False},
            ),
        ),
    )


def _lm_only(variant: str) -> PipelineConfig:
    return PipelineConfig(model_type=LM_ONLY_PIPELINE_KEY, stages=(_lm_stage(variant, final=True),))


PIPELINES = {variant: _two_stage(variant) for variant in ("parallel", "flattened")}
LM_ONLY_PIPELINES = {variant: _lm_only(variant) for variant in ("parallel", "flattened")}


def _variant(hf_config: Any) -> str | None:
    if hf_config is None or not is_kani_config(hf_config):
        return None
    return KaniTTSSettings.from_hf_config(hf_config).variant


def resolve_pipeline(hf_config: Any) -> PipelineConfig | None:
    """Two-stage TTS pipeline for a Kani checkpoint; None for any other model."""
    variant = _variant(hf_config)
    return None if variant is None else PIPELINES[variant]


def resolve_lm_only_pipeline(hf_config: Any) -> PipelineConfig | None:
    """Stage 0 alone (tokens and codes out); used by tests and for debugging a checkpoint."""
    variant = _variant(hf_config)
    return None if variant is None else LM_ONLY_PIPELINES[variant]
