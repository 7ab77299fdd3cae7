"""Kani-TTS-2 on vLLM's LFM2: frame-level positions, per-layer learnable RoPE, the speaker embedding.

The official ``KaniTTS2ForCausalLM`` (``kani-tts-2`` 0.0.5) is LFM2 with three changes, each a piece here
that ``kani_tts_lm._KaniLfm2Base`` plugs in when ``config.json`` asks for it
(:class:`~.configuration.FrameLevelSettings`):

* **Frame-level positions.** A token at sequence index ``p`` gets RoPE position ``p`` unless it is an
  audio code; the codes of one frame share a position, which advances by ``audio_step`` per frame from
  the index ``S0`` of the request's first audio code: ``S0 + ((p − S0) // 4) · audio_step``. vLLM hands
  the model ``p``; ``S0`` is per-request state kept on the device (:class:`AudioStartTracker`), so
  prefill and decode compute positions the same way, with no host synchronisation, inside a captured
  CUDA graph too.
* **Learnable RoPE per attention layer** (:class:`FrameRotaryEmbedding`): ``inv_freq · α``, computed on
  the fly because frame positions need not be integers (``audio_step`` 0.5).
* **Speaker embedding.** ``speaker_emb_dim`` floats, projected to the hidden size, are the prompt's
  second row. The prompt carries ``token_layout.SPEAKER_EMBEDDING_SLOT`` there and the request carries
  the vector in ``additional_information["speaker_embedding"]``; the projected vector replaces the
  slot's embedding (:class:`SpeakerSplice`). Positions stay sequential across the slot, as in the
  official prefill.

The official ``generate()`` with a speaker embedding leaves ``cache_position`` one behind the sequence,
so every decode step's query cannot see its own key. That is an artifact of its generation loop, not of
the model; this implementation computes the model as its forward defines it (plain causal attention),
which is also what the official ``generate()`` does without a speaker embedding.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn
from vllm.config import VllmConfig
from vllm.forward_context import get_forward_context, is_forward_context_available
from vllm.logger import init_logger
from vllm.model_executor.layers.linear import ReplicatedLinear

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.configuration import FrameLevelSettings, KaniConfigError
from vllm_omni_kani.model_executor.models.kani_tts.lora import without_lora

logger = init_logger(__name__)

SPEAKER_EMBEDDING_KEY = tl.SPEAKER_EMBEDDING_KEY
# "No audio code yet" in the per-request audio start (any position is smaller).
NO_AUDIO = 1 << 62

# Official checkpoint names of the weights LFM2 does not have.
SPEAKER_PROJECTION_WEIGHT = "model.speaker_emb_projection.weight"
ROPE_SCALE_WEIGHT = "model.learnable_rope_layers.{}.alpha_weight"


def frame_positions(
    token_ids: torch.Tensor, positions: torch.Tensor, audio_start: torch.Tensor, tokens_per_frame: int, step: float
) -> torch.Tensor:
    """RoPE positions ``[N]`` float32 of tokens at sequence indices ``positions`` ``[N]``.

    ``audio_start`` ``[N]`` is the index of the first audio code of each token's request (any value
    for a token that is not an audio code). Same arithmetic as the official
    ``compute_frame_level_positions``: ``start + frames · step`` in float32.
    """
    is_audio = token_ids >= tl.AUDIO_TOKEN_OFFSET
    positions = positions.long()
    start = torch.where(is_audio, audio_start, positions)
    frames = torch.div(positions - start, tokens_per_frame, rounding_mode="floor")
    return torch.where(is_audio, start + frames * step, positions.float())


class FrameRotaryEmbedding(nn.Module):
    """Neox-style RoPE at float positions, optionally scaled by a learned per-layer ``α`` (official
    ``LearnableRotaryEmbedding``): ``α = alpha_min + (alpha_max − alpha_min) · sigmoid(alpha_weight)``."""

    def __init__(self, head_dim: int, base: float, settings: FrameLevelSettings):
        super().__init__()
        exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim
        self.register_buffer("inv_freq_base", 1.0 / (base**exponents), persistent=False)
        self.alpha_min, self.alpha_max = settings.alpha_min, settings.alpha_max
        self.alpha_weight = nn.Parameter(torch.zeros(())) if settings.use_learnable_rope else None

    def inv_freq(self) -> torch.Tensor:
        if self.alpha_weight is None:
            return self.inv_freq_base
        alpha = self.alpha_min + (self.alpha_max - self.alpha_min) * torch.sigmoid(self.alpha_weight)
        return self.inv_freq_base * alpha

    def forward(
        self, positions: torch.Tensor, query: torch.Tensor, key: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``query`` ``[N, heads, head_dim]``, ``key`` ``[N, kv_heads, head_dim]``, ``positions`` ``[N]``."""
        freqs = positions.float()[:, None] * self.inv_freq().float()[None, :]
        cos = freqs.cos().to(query.dtype)[:, None, :]
        sin = freqs.sin().to(query.dtype)[:, None, :]
        return _rotate(query, cos, sin), _rotate(key, cos, sin)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x · cos + rotate_half(x) · sin, written per half.
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


class AudioStartTracker(nn.Module):
    """Per-request sequence index of the first audio code, in a device buffer indexed by the request's
    short-conv state slot (vLLM keeps that slot for the request's whole life, and never gives slot 0,
    its null block, to a request).

    Each step, before reading: a request's first prefill row (position 0) clears its slot, then every
    audio-code row lowers its slot's value to its own position. All device ops on buffers of fixed
    size, so a captured decode graph replays them as they are.
    """

    def __init__(self, conv_layer: nn.Module):
        super().__init__()
        # Not a submodule (its weights belong to the backbone): a plain reference.
        self._conv_layer = [conv_layer]
        self.register_buffer("starts", torch.empty(0, dtype=torch.long), persistent=False)

    def _metadata(self) -> Any:
        if not is_forward_context_available():
            return None
        metadata = get_forward_context().attn_metadata
        if isinstance(metadata, list):
            metadata = metadata[0] if metadata else None
        return (metadata or {}).get(self._conv_layer[0].prefix)

    def _buffer(self, device: torch.device) -> torch.Tensor:
        # One slot per short-conv state block plus a last one for padding rows. Sized from the state
        # cache (a host-side shape); its contents need no initial value, as every request clears its slot.
        needed = self._conv_layer[0].kv_cache[0].shape[0] + 1
        if self.starts.numel() < needed:
            self.starts = torch.empty(needed, dtype=torch.long, device=device)
        return self.starts

    def audio_start(self, token_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor | None:
        """``[N]`` index of each row's request's first audio code, or None outside a real step (profiling)."""
        metadata = self._metadata()
        if metadata is None:
            return None
        starts = self._buffer(token_ids.device)
        dummy = starts.numel() - 1
        slots = torch.full_like(token_ids, dummy, dtype=torch.long)
        decodes = metadata.num_decode_tokens
        if decodes:
            state = metadata.state_indices_tensor_d
            slots[:decodes] = (state[:, 0] if state.dim() == 2 else state)[:decodes]
        if metadata.num_prefills:
            count = metadata.num_prefill_tokens
            rows = torch.arange(count, device=token_ids.device)
            request = torch.searchsorted(metadata.query_start_loc_p[1:], rows, right=True)
            slots[decodes : decodes + count] = metadata.state_indices_tensor_p[request].long()
        positions = positions.long()
        starts.index_fill_(0, torch.where(positions == 0, slots, dummy), NO_AUDIO)
        audio_rows = torch.where(token_ids >= tl.AUDIO_TOKEN_OFFSET, positions, NO_AUDIO)
        starts.scatter_reduce_(0, slots, audio_rows, reduce="amin")
        return starts[slots]


class SpeakerSplice(nn.Module):
    """``speaker_emb_projection`` and its use: the projected speaker embedding of each request that has one
    becomes the embedding of its prompt's ``SPEAKER_EMBEDDING_SLOT`` row.

    Runs in the eager part of a prefill step: vLLM captures whole-model graphs for single-token decode
    batches only, and a decode step has no prompt row.
    """

    def __init__(self, hidden_size: int, speaker_emb_dim: int, prefix: str):
        super().__init__()
        self.speaker_emb_dim = speaker_emb_dim
        self.speaker_emb_projection = ReplicatedLinear(
            speaker_emb_dim, hidden_size, bias=False, prefix=f"{prefix}.speaker_emb_projection"
        )

    def splice(self, input_ids: torch.Tensor, embeds: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        """``embeds`` ``[N, H]`` with the slot rows of this step's speaker-conditioned prefills replaced."""
        infos = kwargs.get("runtime_additional_information") or ()
        spans = kwargs.get("request_token_spans") or ()
        owners: list[tuple[int, int]] = []
        vectors: list[torch.Tensor] = []
        for info, (start, end) in zip(infos, spans, strict=False):
            vector = info.get(SPEAKER_EMBEDDING_KEY) if isinstance(info, dict) else None
            if vector is None or info.get("generated_len", 0) > 0:
                continue
            vector = torch.as_tensor(vector, dtype=torch.float32).reshape(-1)
            if vector.numel() != self.speaker_emb_dim:
                logger.error(
                    "speaker embedding of %d floats ignored: this model takes %d", vector.numel(), self.speaker_emb_dim
                )
                continue
            owners.append((start, end))
            vectors.append(vector)
        if not vectors:
            return embeds
        owner = torch.full((input_ids.shape[0],), -1, dtype=torch.long)
        for k, (start, end) in enumerate(owners):
            owner[start:end] = k
        owner = owner.to(input_ids.device, non_blocking=True)
        # One row per request, not the step's tokens: never through a LoRA wrapper (see lora.py).
        projection = without_lora(self.speaker_emb_projection)
        projected, _ = projection(torch.stack(vectors).to(embeds.device, embeds.dtype))
        splice = (input_ids == tl.SPEAKER_EMBEDDING_SLOT) & (owner >= 0)
        return torch.where(splice[:, None], projected[owner.clamp(min=0)], embeds)


class KaniTTS2Layers(nn.Module):
    """What Kani-TTS-2 adds to a vLLM LFM2: installs the rotary modules into the backbone's attention
    layers, and owns the audio-start tracker and the speaker projection."""

    def __init__(self, backbone: nn.Module, settings: FrameLevelSettings, vllm_config: VllmConfig, prefix: str):
        super().__init__()
        config = vllm_config.model_config.hf_config
        mode = vllm_config.cache_config.mamba_cache_mode
        if mode != "none":
            raise KaniConfigError(
                f"Kani-TTS-2 keeps per-request state in the short-conv state slot, which prefix caching "
                f"(mamba_cache_mode={mode!r}) moves between blocks: serve it with enable_prefix_caching: false"
            )
        rope = dict(getattr(config, "rope_parameters", None) or {})
        rope_type = rope.get("rope_type", rope.get("type", "default"))
        if rope_type != "default":
            raise KaniConfigError(f"Kani-TTS-2 uses plain RoPE; this config asks for rope_type {rope_type!r}")
        base = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
        self.settings = settings
        self.attention_layers: list[int] = []
        conv_layer = None
        for index, layer in enumerate(backbone.layers):
            if hasattr(layer, "self_attn"):
                attn = layer.self_attn
                attn.rotary_emb = FrameRotaryEmbedding(attn.head_dim, base, settings)
                self.attention_layers.append(index)
            elif conv_layer is None and hasattr(layer, "short_conv"):
                conv_layer = layer.short_conv
        if conv_layer is None:
            raise KaniConfigError("Kani-TTS-2 on LFM2 needs at least one short-conv layer")
        self.tracker = AudioStartTracker(conv_layer)
        self.speaker = (
            None
            if settings.speaker_emb_dim is None
            else SpeakerSplice(config.hidden_size, settings.speaker_emb_dim, prefix)
        )

    def positions(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        start = self.tracker.audio_start(input_ids, positions)
        if start is None:
            return positions.float()
        return frame_positions(input_ids, positions, start, self.settings.tokens_per_frame, self.settings.audio_step)

    def embeddings(self, embed: Any, input_ids: torch.Tensor, kwargs: dict[str, Any]) -> torch.Tensor:
        embeds = embed(input_ids)
        return embeds if self.speaker is None else self.speaker.splice(input_ids, embeds, kwargs)

    def weight_names(self) -> dict[str, str]:
        """Official checkpoint name → this model's parameter name."""
        names = {}
        if self.settings.use_learnable_rope:
            for i in self.attention_layers:
                names[ROPE_SCALE_WEIGHT.format(i)] = f"model.layers.{i}.self_attn.rotary_emb.alpha_weight"
        if self.speaker is not None:
            names[SPEAKER_PROJECTION_WEIGHT] = "kani_tts2.speaker.speaker_emb_projection.weight"
        return names
