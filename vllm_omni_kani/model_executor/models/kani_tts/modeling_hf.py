"""Transformers reference for the parallel-head Kani model, and the plain generation loop.

This is the ground truth that parity tests and the naive benchmark baseline use: a stock
LFM2 backbone, ``lm_head`` for codebook 1 (plus the text/control ids) and three linear heads
for codebooks 2-4, all reading the same final hidden state. One step emits one frame.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn
from transformers import Lfm2Config
from transformers.cache_utils import DynamicCache
from transformers.models.lfm2.modeling_lfm2 import Lfm2Model, Lfm2PreTrainedModel

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.speech_mask import SpeechMask

EXTRA_HEADS = ("cb2_head", "cb3_head", "cb4_head")


class ParallelHeadLfm2ForCausalLM(Lfm2PreTrainedModel):
    """LFM2 with one vocabulary head and ``NUM_CODEBOOKS - 1`` code heads."""

    config_class = Lfm2Config
    _tied_weights_keys = {"lm_head.weight": "model.embed_tokens.weight"}  # noqa: RUF012 (HF convention)

    def __init__(self, config: Lfm2Config):
        super().__init__(config)
        self.model = Lfm2Model(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        for name in EXTRA_HEADS:
            setattr(self, name, nn.Linear(config.hidden_size, tl.CODEBOOK_SIZE, bias=False))
        self.post_init()

    def code_heads(self) -> list[nn.Linear]:
        return [getattr(self, name) for name in EXTRA_HEADS]

    def forward(self, input_ids: torch.Tensor, past_key_values: DynamicCache | None = None, **kwargs):
        """Returns the final hidden states ``[B, S, H]`` and the cache."""
        out = self.model(input_ids=input_ids, past_key_values=past_key_values, use_cache=True, **kwargs)
        return out.last_hidden_state, out.past_key_values


@dataclass
class SamplingConfig:
    """temperature 0 means greedy; ``top_k`` <= 0 and ``top_p`` >= 1 disable those filters."""

    temperature: float = 0.0
    top_k: int = -1
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None


def _sample(logits: torch.Tensor, cfg: SamplingConfig, gen: torch.Generator | None) -> int:
    """Sample one id from ``[V]`` float32 logits (already masked)."""
    if cfg.temperature <= 0:
        return int(torch.argmax(logits))
    logits = logits / cfg.temperature
    if cfg.top_k > 0:
        kth = torch.topk(logits, min(cfg.top_k, logits.numel())).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(-1)
        drop = cum - torch.softmax(sorted_logits, dim=-1) > cfg.top_p
        logits[order[drop]] = float("-inf")
    probs = torch.softmax(logits, dim=-1)
    return int(torch.multinomial(probs, 1, generator=gen))


def _penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """HF/vLLM repetition penalty over ids already in the sequence."""
    if penalty == 1.0:
        return logits
    picked = logits[seen]
    logits[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


@torch.no_grad()
def generate_frames(
    model: ParallelHeadLfm2ForCausalLM,
    prompt_ids: Sequence[int],
    max_new_frames: int,
    sampling: SamplingConfig | None = None,
) -> torch.Tensor:
    """Generate one request's frames ``[T, NUM_CODEBOOKS]`` (codes 0..CODEBOOK_SIZE-1).

    Each step samples codebook 1 from ``lm_head`` and codebooks 2-4 from the extra heads on
    the same hidden state; generation stops at END_OF_SPEECH (not a frame) or after
    ``max_new_frames`` steps that produced audio.
    """
    cfg = sampling or SamplingConfig()
    device = next(model.parameters()).device
    gen = None
    if cfg.seed is not None:
        gen = torch.Generator(device="cpu").manual_seed(cfg.seed)
    vocab = model.config.vocab_size
    ids = list(prompt_ids)
    cache = DynamicCache(config=model.config)
    hidden, cache = model(torch.tensor([ids], device=device), past_key_values=cache)
    frames: list[list[int]] = []
    heads = model.code_heads()
    mask = SpeechMask(vocab, "parallel")
    while len(frames) < max_new_frames:
        h = hidden[0, -1]
        logits = model.lm_head(h).float().cpu()
        seen = torch.zeros(vocab, dtype=torch.bool)
        seen[torch.tensor(ids)] = True
        logits = _penalize(logits, seen, cfg.repetition_penalty)
        logits = mask.apply(logits[None], mask.phases(torch.tensor([ids[-1]])))[0]
        token = _sample(logits, cfg, gen)
        if token == tl.END_OF_SPEECH:
            break
        if tl.AUDIO_TOKEN_OFFSET <= token < tl.AUDIO_TOKEN_OFFSET + tl.CODEBOOK_SIZE:
            rest = [_sample(head(h).float().cpu(), cfg, gen) for head in heads]
            frames.append([token - tl.AUDIO_TOKEN_OFFSET, *rest])
        ids.append(token)
        hidden, cache = model(torch.tensor([[token]], device=device), past_key_values=cache)
    return torch.tensor(frames, dtype=torch.long).reshape(-1, tl.NUM_CODEBOOKS)


@torch.no_grad()
def greedy_gaps(model: ParallelHeadLfm2ForCausalLM, prompt_ids: Sequence[int], token_ids: Sequence[int]) -> list[float]:
    """Per generated codebook-1 token, how far its masked logit lies below the best one when the reference is fed
    the same prefix (prompt and the tokens before it): 0 where greedy decoding agrees.

    An engine's greedy stream can leave the reference's where two logits are nearly tied (a different kernel's
    rounding picks the other); once it has, comparing streams says nothing more. Feeding the reference the engine's
    own tokens checks every step: a gap of the rounding's size is a tie, a larger one is a wrong step.
    """
    device = next(model.parameters()).device
    ids = [*prompt_ids, *token_ids]
    hidden, _ = model(torch.tensor([ids], device=device), past_key_values=DynamicCache(config=model.config))
    first = len(prompt_ids) - 1  # the position whose hidden state picks the first generated token
    steps = len(token_ids)
    logits = model.lm_head(hidden[0, first : first + steps]).float().cpu()
    mask = SpeechMask(model.config.vocab_size, "parallel")
    logits = mask.apply(logits, mask.phases(torch.tensor(ids[first : first + steps])))
    chosen = logits.gather(1, torch.tensor(token_ids, dtype=torch.long)[:, None])[:, 0]
    return (logits.max(dim=-1).values - chosen).tolist()
