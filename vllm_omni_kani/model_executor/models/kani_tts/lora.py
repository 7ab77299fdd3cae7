"""LoRA on the Kani LM: which layers an adapter changes, and the ones it must not.

vLLM serves a LoRA adapter by wrapping every linear layer of the model (``get_supported_lora_modules``: each
``LinearBase`` by its last name) in a LoRA layer that adds each token's adapter delta, the adapter chosen by the
step's token → adapter map. That map has one row per token of the step, so a wrapped layer only works on the
step's hidden states, row for row. Two Kani layers run on other rows: the codebook heads on the rows vLLM samples
(``make_omni_output``), and Kani-TTS-2's speaker projection on one embedding per request. Called through the LoRA
wrapper they fail (``bgmv_shrink``: "The expanded size of the tensor (1) must match the existing size (26)"), so
they call the wrapped layer itself: adapters change the LFM2 backbone (attention, short-conv projections, MLP),
never these layers.
"""

from __future__ import annotations

from torch import nn


def without_lora(layer: nn.Module) -> nn.Module:
    """``layer`` as loaded: the layer a vLLM LoRA wrapper holds (``base_layer``), or ``layer`` when none wraps it."""
    return getattr(layer, "base_layer", layer)
