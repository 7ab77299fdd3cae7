"""Stage 0 under vLLM: vLLM's LFM2 plus the Kani speech grammar, and for parallel-head
checkpoints the three extra codebook heads.

Only what is new lives here; the backbone, hybrid short-conv state, PagedAttention and
weight mapping are vLLM's ``Lfm2ForCausalLM``.

How one step turns into one frame (parallel heads):

* ``forward`` runs the backbone (CUDA-graph captured by vLLM) and, inside the captured
  region, records for each request the grammar phase after its last scheduled token.
* ``make_omni_output`` runs eagerly right after, with vLLM-Omni's per-step kwargs: it takes
  the rows vLLM will sample (``logits_index``) and samples codebooks 2-4 from the extra
  heads with each request's sampling parameters. The codes travel as a per-token multimodal output ``codes.audio``
  ``[num_tokens, 3]``: a sampled row whose token vLLM keeps holds its codes, every other
  row holds -1. So the code row of a step belongs to the codebook-1 token sampled in that
  step, and chunked-prefill steps that sample nothing carry nothing.
* ``compute_logits`` masks codebook 1 to what the grammar allows after each row's
  previous token (audio codes and END_OF_SPEECH in speech), so text is never sampled.

A checkpoint whose ``config.json`` has Kani-TTS-2's fields (frame-level positions, learnable RoPE,
speaker embedding) gets them from ``kani_tts2_lm.KaniTTS2Layers``, whichever variant it is.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.logger import init_logger
from vllm.model_executor.layers.linear import ReplicatedLinear
from vllm.model_executor.models.lfm2 import Lfm2ForCausalLM
from vllm.model_executor.models.utils import maybe_prefix
from vllm_omni.model_executor.models.output_templates import OmniOutput

from vllm_omni_kani import patch
from vllm_omni_kani.model_executor.layers.mamba import lean_short_conv
from vllm_omni_kani.model_executor.models.kani_tts import codebook1_noise, open_columns, warm_ups
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.code_sampler import sample_packed_codes, warm_up_kernels
from vllm_omni_kani.model_executor.models.kani_tts.configuration import FrameLevelSettings, additional_config
from vllm_omni_kani.model_executor.models.kani_tts.kani_tts2_lm import KaniTTS2Layers
from vllm_omni_kani.model_executor.models.kani_tts.kernel_trace import KernelTrace
from vllm_omni_kani.model_executor.models.kani_tts.lora import without_lora
from vllm_omni_kani.model_executor.models.kani_tts.pinned_staging import PinnedStaging, to_host_in_stream_order
from vllm_omni_kani.model_executor.models.kani_tts.speech_mask import Phase, SpeechMask
from vllm_omni_kani.model_executor.models.kani_tts.step_meter import StepMeter

logger = init_logger(__name__)

CODE_HEAD_NAMES = tuple(f"cb{k + 1}_head" for k in range(1, tl.NUM_CODEBOOKS))
NUM_CODE_HEADS = len(CODE_HEAD_NAMES)


class KaniWeightError(ValueError):
    """A checkpoint tensor that does not fit the Kani model; the message names the tensor."""


class _KaniLfm2Base(Lfm2ForCausalLM):
    """vLLM LFM2 plus the speech grammar mask; subclasses choose the variant."""

    variant = "flattened"

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        if lean_short_conv.enabled(additional_config(vllm_config)):
            layers = lean_short_conv.make_lean(self.model)
            logger.info("%s: %d short-conv layers keep only the convolution eager", lean_short_conv.CONFIG_KEY, layers)
        # vLLM's sampler, in this process only (KANI_STAGE0_SAMPLER_PATCHES, on by default): the penalties'
        # output-token counts kept on the device, seeded codebook-1 noise hashed for the whole batch, top-k/top-p
        # over the columns the speech mask can leave open.
        sampler_patches = patch.apply_stage0_sampling()
        device = next(self.parameters()).device
        self.speech_mask = SpeechMask(self.config.vocab_size, self.variant)
        patch_warm_ups: list[warm_ups.WarmUp] = []
        if patch.hash_seeded_codebook1_noise.__name__ in sampler_patches:
            patch_warm_ups += codebook1_noise.kernel_warm_ups(self.config.vocab_size, device)
        if patch.filter_top_k_in_open_columns.__name__ in sampler_patches:
            open_columns.open_from(self.speech_mask.first_open, self.config.vocab_size)
            patch_warm_ups += open_columns.kernel_warm_ups(device)
        warm_ups.run(patch_warm_ups, device)
        # vLLM-Omni's deferred output building (with async scheduling and async_chunk) is an experiment switch, off
        # by default: on an H200 it served 8-20% fewer frames/s than the shipped file in both orders (its audio whole
        # since the per-step codes are as long as the scheduled tokens; docs/BENCHMARKS.md, twenty-sixth set).
        self.use_async_omni_output = bool(additional_config(vllm_config).get("kani_async_omni_output", False))
        self.step_meter = StepMeter()
        self.kernel_trace = KernelTrace("stage0")
        frame_level = FrameLevelSettings.from_hf_config(self.config)
        self.kani_tts2 = None
        if frame_level is not None:
            self.kani_tts2 = KaniTTS2Layers(self.model, frame_level, vllm_config, maybe_prefix(prefix, "kani_tts2"))
        sched = vllm_config.scheduler_config
        capture = vllm_config.compilation_config.max_cudagraph_capture_size or 0
        # Phase of the last input token of each request in the step (the row vLLM samples),
        # written inside the forward so that it is part of a captured CUDA graph.
        max_rows = max(sched.max_num_seqs, capture) + 1
        self.register_buffer("_row_phase", torch.full((max_rows,), int(Phase.SPEECH_0)), persistent=False)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors: Any = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> torch.Tensor:
        if self.kani_tts2 is not None and input_ids is not None:
            # Always through embeddings (one compiled signature); the speaker rows are spliced in here.
            inputs_embeds = self.kani_tts2.embeddings(self.model.embed_input_ids, input_ids, kwargs)
            frame_positions = self.kani_tts2.positions(input_ids, positions)
            hidden = self.model(None, frame_positions, intermediate_tensors, inputs_embeds)
        else:
            hidden = super().forward(input_ids, positions, intermediate_tensors, inputs_embeds)
        self._record_row_phases(input_ids)
        return hidden

    def _record_row_phases(self, input_ids: torch.Tensor | None) -> None:
        """Look up the phase after each request's last scheduled token (device-only ops)."""
        query_start_loc = _attention_query_start_loc()
        if input_ids is None or query_start_loc is None:
            return
        last = (query_start_loc[1:] - 1).clamp(0, input_ids.shape[0] - 1)
        self._row_phase[: last.shape[0]].copy_(self.speech_mask.phases(input_ids[last]))

    def compute_logits(self, hidden_states: torch.Tensor, sampling_metadata: Any = None) -> torch.Tensor:
        logits = super().compute_logits(hidden_states)
        self.step_meter.tick(logits.shape[0])
        self.kernel_trace.tick()
        return self.speech_mask.apply(logits, self._row_phase[: logits.shape[0]])

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        if self.kani_tts2 is None:
            return super().load_weights(weights)
        names = self.kani_tts2.weight_names()
        params = dict(self.named_parameters())
        found: set[str] = set()

        def lfm2_weights() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                if name not in names:
                    yield name, tensor
                    continue
                param = params[names[name]]
                _check_shape(name, tensor, tuple(param.shape))
                param.data.copy_(tensor)
                found.add(name)

        loaded = super().load_weights(lfm2_weights())
        for name in sorted(set(names) - found):
            # As the official loader does: a missing RoPE scale stays at α's midpoint (alpha_weight 0), and a
            # missing speaker projection leaves speaker embeddings without effect beyond their slot row.
            logger.warning("checkpoint has no %s: %s keeps its initial value", name, names[name])
            params[names[name]].data.zero_()
        return loaded | set(names.values())


def scheduled_tokens(hidden: torch.Tensor, kwargs: dict[str, Any]) -> int:
    """The step's scheduled tokens (the runner's per-request spans end there), not the CUDA-graph-padded rows.

    vLLM-Omni cuts a per-token payload into requests only when its length is the hidden rows' or the scheduled
    tokens'; with deferred output building it no longer sees the hidden rows, so a padded payload went whole to every
    request, which then took the last (padding) row: lost and misplaced frames (docs/BENCHMARKS.md, twenty-sixth set).
    """
    spans = kwargs.get("request_token_spans")
    return int(spans[-1][1]) if spans else int(hidden.shape[0])


def _attention_query_start_loc() -> torch.Tensor | None:
    """``query_start_loc`` of the step from any attention layer's metadata, if a step is running."""
    if not is_forward_context_available():
        return None
    metadata = get_forward_context().attn_metadata
    if isinstance(metadata, list):
        metadata = metadata[0] if metadata else None
    for layer_metadata in (metadata or {}).values():
        loc = getattr(layer_metadata, "query_start_loc", None)
        if isinstance(loc, torch.Tensor):
            return loc
    return None


class KaniFlattenedLfm2ForCausalLM(_KaniLfm2Base):
    """Stock flattened Kani-TTS (plain LFM2 weights, four tokens per frame) with the grammar mask;
    Kani-TTS-2 checkpoints run as this class too (see ``kani_tts2_lm``)."""

    variant = "flattened"


class KaniTTS2ForCausalLM(KaniFlattenedLfm2ForCausalLM):
    """Kani-TTS-2 under its official architecture name, for vLLM loading the checkpoint as it is."""


class ParallelHeadLfm2ForCausalLM(_KaniLfm2Base):
    """LFM2 whose every decode step emits a whole frame: codebook 1 sampled by vLLM from
    ``lm_head``, codebooks 2-4 sampled here from three heads on the same hidden state."""

    variant = "parallel"
    have_multimodal_outputs = True
    # The per-step payload carries only the codes; the hidden states stay on the device.
    omni_pooler_payload_include_hidden = False
    # Ask the runner which sampled rows produce a kept token (not a chunked-prefill step).
    requires_request_sample_eligibility = True
    # The step's payload is its host codes alone: the runner may hand them over as one tensor
    # and per-request spans (worker/step_code_rows.py) rather than a dict per request.
    omni_step_code_rows = True

    def __init__(self, *, vllm_config: VllmConfig, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix)
        # The three heads as one GEMM: rows [k*C, (k+1)*C) are codebook k+2.
        self.code_heads = ReplicatedLinear(
            self.config.hidden_size,
            NUM_CODE_HEADS * tl.CODEBOOK_SIZE,
            bias=False,
            prefix=f"{prefix}.code_heads" if prefix else "code_heads",
        )
        # The runner's per-row "kept token" flags reach the device through pinned buffers: a pageable copy would
        # make the host wait for the forward pass before it can launch the heads and the sampler.
        self._eligible_staging = PinnedStaging()

    def code_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """``[R, H]`` → ``[R, 3, CODEBOOK_SIZE]``."""
        out, _ = without_lora(self.code_heads)(hidden)  # R sampled rows, not the step's tokens
        return out.view(-1, NUM_CODE_HEADS, tl.CODEBOOK_SIZE)

    def make_omni_output(self, model_output: Any, **kwargs: Any) -> Any:
        hidden = model_output
        logits_index = kwargs.get("logits_index")
        tokens = scheduled_tokens(hidden, kwargs)
        if logits_index is None or not logits_index.numel():
            codes = torch.full((tokens,), tl.NO_CODES, dtype=torch.long, device=hidden.device)
        else:
            # vLLM samples each request's last token, in token order: a step that samples as many rows as it has
            # tokens (every decode step) samples token i in row i, with no gather and no scatter.
            every_token = logits_index.numel() == tokens
            rows = None if every_token else logits_index.to(hidden.device).long()
            picked = hidden[:tokens] if every_token else hidden[rows]
            codes = sample_packed_codes(self.code_logits(picked), kwargs.get("sampling_metadata"))
            eligible = kwargs.get("request_sample_eligible")
            if eligible is not None and len(eligible) == codes.shape[0]:
                eligible = np.asarray(eligible, dtype=np.bool_)
                if not eligible.all():  # a decode step keeps every row: no copy, no select
                    keep = self._eligible_staging.to_device(eligible, hidden.device)
                    codes = torch.where(keep, codes, tl.NO_CODES)
            if not every_token:
                sampled, codes = codes, torch.full((tokens,), tl.NO_CODES, dtype=torch.long, device=hidden.device)
                codes[rows] = sampled
        if codes.is_cuda and not self.use_async_omni_output:
            codes = to_host_in_stream_order(codes)
        return OmniOutput(text_hidden_states=hidden, multimodal_outputs={tl.CODES_KEY[0]: {tl.CODES_KEY[1]: codes}})

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        hidden = self.config.hidden_size
        seen_heads: set[str] = set()
        head_weight = self.code_heads.weight

        def backbone_weights() -> Iterable[tuple[str, torch.Tensor]]:
            for name, tensor in weights:
                head = name.removesuffix(".weight")
                if head in CODE_HEAD_NAMES and name.endswith(".weight"):
                    _check_shape(name, tensor, (tl.CODEBOOK_SIZE, hidden))
                    k = CODE_HEAD_NAMES.index(head)
                    head_weight.data[k * tl.CODEBOOK_SIZE : (k + 1) * tl.CODEBOOK_SIZE].copy_(tensor)
                    seen_heads.add(head)
                    continue
                if name in ("lm_head.weight", "model.embed_tokens.weight"):
                    _check_shape(name, tensor, (self.config.vocab_size, hidden))
                yield name, tensor

        loaded = super().load_weights(backbone_weights())
        missing = [h for h in CODE_HEAD_NAMES if h not in seen_heads]
        if missing:
            raise KaniWeightError(
                f"checkpoint has no {', '.join(m + '.weight' for m in missing)}: a parallel-head Kani checkpoint "
                f"needs {', '.join(CODE_HEAD_NAMES)} ([{tl.CODEBOOK_SIZE}, {hidden}] each). A flattened Kani-TTS "
                f"checkpoint should declare architectures=['Lfm2ForCausalLM'] instead."
            )
        warm_up_kernels(NUM_CODE_HEADS, tl.CODEBOOK_SIZE, head_weight.device, head_weight.dtype)
        return loaded | {"code_heads.weight"}


def _check_shape(name: str, tensor: torch.Tensor, expected: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != expected:
        raise KaniWeightError(
            f"checkpoint tensor {name} has shape {list(tensor.shape)}, expected {list(expected)} "
            f"(vocab/codebook sizes of the Kani layout, hidden size from config.json)"
        )
