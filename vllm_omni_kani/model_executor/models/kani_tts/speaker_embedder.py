"""Kani-TTS-2's speaker model: reference audio → the speaker embedding its LM takes.

The official ``kani-tts-2`` 0.0.5 ``SpeakerEmbedder`` (after Orange's Speaker-wavLM-tbr, published as
``nineninesix/speaker-emb-tbr``): mean/variance-normalised 16 kHz audio → WavLM → mean and standard
deviation of the last hidden states over time → two 1x1 convolutions, each ReLU then BatchNorm without
affine → L2 normalisation. Its 128 floats are the LM's ``speaker_emb_dim``.

:class:`SpeakerEmbeddingModel` has the official module names (``wavlm.*``, ``top_layers.*``), so the
published weights load unchanged with transformers' WavLM classes; :func:`prepare_reference` turns a decoded
clip into the model's input (mono, 16 kHz, within the length limits) or says what is wrong with it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from transformers import WavLMConfig
from transformers.models.wavlm.modeling_wavlm import WavLMModel, WavLMPreTrainedModel

# A speaker model's folder inside a Kani-TTS-2 checkpoint (the deploy YAML may name another).
SPEAKER_MODEL_SUBDIR = "speaker_model"
# WavLM reads 16 kHz audio.
SAMPLE_RATE = 16000
# Reference clip length, as vLLM-Omni bounds reference audio for its other TTS models (and the official embedder
# reads at most 30 s).
MIN_SECONDS = 1.0
MAX_SECONDS = 30.0
# Lowest input rate accepted (telephone speech); anything at or above it is resampled to 16 kHz.
MIN_SAMPLE_RATE = 8000


class ReferenceAudioError(ValueError):
    """Reference audio that cannot become a speaker embedding; the message says why."""


class TopLayers(nn.Module):
    """Pooled statistics ``[B, 2·hidden, 1]`` → L2-normalised embedding ``[B, embd_size]``."""

    def __init__(self, in_size: int, embd_size: int, interm_size: int):
        super().__init__()
        self.affine1 = nn.Conv1d(in_size, interm_size, kernel_size=1)
        self.batchnorm1 = nn.BatchNorm1d(interm_size, affine=False, eps=1e-3)
        self.affine2 = nn.Conv1d(interm_size, embd_size, kernel_size=1)
        self.batchnorm2 = nn.BatchNorm1d(embd_size, affine=False, eps=1e-3)

    def forward(self, stats: torch.Tensor) -> torch.Tensor:
        out = self.batchnorm1(F.relu(self.affine1(stats)))
        out = self.batchnorm2(F.relu(self.affine2(out)))
        return F.normalize(out[:, :, 0])


class SpeakerEmbeddingModel(WavLMPreTrainedModel):
    """WavLM plus the official top layers; ``config`` is a ``WavLMConfig`` with ``embd_size`` and
    ``top_interm_size`` (the official model: WavLM-large, hidden 1,024 → 2,048 pooled → 512 → 128)."""

    def __init__(self, config: WavLMConfig):
        super().__init__(config)
        self.wavlm = WavLMModel(config)
        self.top_layers = TopLayers(2 * config.hidden_size, config.embd_size, config.top_interm_size)
        self.post_init()

    @property
    def embedding_dim(self) -> int:
        return int(self.config.embd_size)

    def forward(self, input_values: torch.Tensor) -> torch.Tensor:
        """``input_values`` ``[B, samples]`` at 16 kHz → ``[B, embd_size]``, unit L2 norm per row."""
        x = (input_values - input_values.mean(dim=1, keepdim=True)) / (input_values.std(dim=1, keepdim=True) + 1e-10)
        hidden = self.wavlm(input_values=x).last_hidden_state
        mean = hidden.mean(dim=1)
        std = hidden.var(dim=1).clamp(min=1e-10).pow(0.5)
        return self.top_layers(torch.cat((mean, std), dim=1).unsqueeze(2))


def prepare_reference(audio: Any, sample_rate: int) -> torch.Tensor:
    """A decoded clip as the speaker model's input: float32 ``[samples]`` at 16 kHz.

    ``audio``: float samples in [-1, 1], ``[T]`` or ``[T, channels]`` (soundfile's layout; channels are averaged),
    at ``sample_rate`` Hz. Raises :class:`ReferenceAudioError` with what to fix.
    """
    wav = np.asarray(audio, dtype=np.float32)
    if wav.ndim == 2:
        wav = wav.mean(axis=1, dtype=np.float32)
    if wav.ndim != 1 or wav.size == 0:
        raise ReferenceAudioError(f"Reference audio must be mono or [samples, channels], got shape {wav.shape}.")
    if not isinstance(sample_rate, int | np.integer) or sample_rate < MIN_SAMPLE_RATE:
        raise ReferenceAudioError(
            f"Reference audio sample rate {sample_rate} Hz is too low: at least {MIN_SAMPLE_RATE} Hz "
            f"(it is resampled to {SAMPLE_RATE} Hz)."
        )
    seconds = wav.size / sample_rate
    if not MIN_SECONDS <= seconds <= MAX_SECONDS:
        raise ReferenceAudioError(
            f"Reference audio is {seconds:.2f} s long; it must be {MIN_SECONDS:g} to {MAX_SECONDS:g} s of speech."
        )
    if not np.isfinite(wav).all():
        raise ReferenceAudioError("Reference audio contains NaN or infinite samples.")
    if not np.any(wav):
        raise ReferenceAudioError("Reference audio is silent (every sample is 0).")
    samples = torch.from_numpy(np.ascontiguousarray(wav))
    if sample_rate != SAMPLE_RATE:
        import torchaudio.functional as AF

        # The official embedder's resampler (torchaudio's sinc/Hann defaults).
        samples = AF.resample(samples, int(sample_rate), SAMPLE_RATE)
    return samples


class SpeakerEmbedder:
    """A speaker model loaded from a local directory, run on the CPU in float32."""

    def __init__(self, model: SpeakerEmbeddingModel):
        self.model = model.float().eval()

    @classmethod
    def from_dir(cls, path: str | Path) -> SpeakerEmbedder:
        return cls(SpeakerEmbeddingModel.from_pretrained(str(path), dtype=torch.float32, device_map="cpu"))

    @property
    def embedding_dim(self) -> int:
        return self.model.embedding_dim

    @torch.inference_mode()
    def embed(self, samples: torch.Tensor) -> torch.Tensor:
        """16 kHz float32 ``[samples]`` (from :func:`prepare_reference`) → ``[embedding_dim]`` float32."""
        return self.model(samples.reshape(1, -1).float())[0]


def speaker_model_dim(path: str | Path) -> int:
    """Embedding size a speaker model directory declares (its ``config.json`` ``embd_size``), without loading it."""
    config_file = Path(path) / "config.json"
    try:
        config = json.loads(config_file.read_text())
        return int(config["embd_size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a Kani-TTS-2 speaker model (config.json with embd_size): {exc}") from exc
