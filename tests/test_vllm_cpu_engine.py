"""A factory checkpoint runs in the real vLLM engine; the AMX conv-width patch keeps LFM2 loadable."""

import pytest
import torch

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl


@pytest.mark.engine
def test_flattened_checkpoint_generates_in_vllm(tiny_flattened):
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=str(tiny_flattened),
        dtype="float32",
        max_model_len=256,
        max_num_seqs=2,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
    )
    prompt = tl.build_prompt([1, 300, 400, 500], prefill_speech_start=False)
    params = SamplingParams(max_tokens=40, temperature=0.0, detokenize=False, ignore_eos=True)
    first, second = (llm.generate([{"prompt_token_ids": prompt}], params)[0] for _ in range(2))
    tokens = list(first.outputs[0].token_ids)
    assert len(tokens) == 40
    assert all(0 <= t < tl.FLATTENED_VOCAB_SIZE for t in tokens)
    assert tokens == list(second.outputs[0].token_ids)  # greedy is deterministic


def test_amx_patch_keeps_width3_conv_unpacked(monkeypatch):
    """Pretend the CPU has AMX tiles: width-3 conv weights must stay as loaded, width-4 still packs."""
    from vllm.model_executor.layers import utils as layer_utils

    from vllm_omni_kani import patch

    assert patch.keep_narrow_conv_weights_unpacked()
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    packed = []
    monkeypatch.setattr(layer_utils.ops, "causal_conv1d_weight_pack", lambda w: packed.append(w.shape) or w)

    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(8, 1, 3), requires_grad=False)
    before = layer.weight.detach().clone()
    layer_utils.dispatch_cpu_unquantized_gemm(layer, remove_weight=True)
    assert torch.equal(layer.weight, before) and layer.weight.shape == (8, 1, 3)
    assert layer._cpu_unpacked_conv_weight.shape == (8, 3)

    wide = torch.nn.Module()
    wide.weight = torch.nn.Parameter(torch.randn(8, 1, 4), requires_grad=False)
    layer_utils.dispatch_cpu_unquantized_gemm(wide, remove_weight=True)
    assert packed == [(8, 4)]


@pytest.mark.engine
def test_parallel_codebook1_through_plain_vllm_equals_reference(tiny_parallel):
    """Without vLLM-Omni the extra heads are idle, but codebook 1 is the same greedy stream."""
    from vllm import LLM, SamplingParams

    from vllm_omni_kani.model_executor.models.kani_tts.modeling_hf import ParallelHeadLfm2ForCausalLM, generate_frames

    prompts = [tl.build_prompt([tl.START_OF_TEXT, *range(300, 300 + n)]) for n in (4, 31)]
    ref_model = ParallelHeadLfm2ForCausalLM.from_pretrained(tiny_parallel, dtype=torch.float32).eval()
    reference = [generate_frames(ref_model, p, 48)[:, 0].tolist() for p in prompts]
    llm = LLM(
        model=str(tiny_parallel),
        dtype="float32",
        max_model_len=256,
        max_num_seqs=2,
        enforce_eager=True,
        kv_cache_memory_bytes=64 << 20,
    )
    params = SamplingParams(max_tokens=48, temperature=0.0, detokenize=False, stop_token_ids=[tl.END_OF_SPEECH])
    for ref, out in zip(reference, llm.generate([{"prompt_token_ids": p} for p in prompts], params), strict=True):
        assert [t - tl.AUDIO_TOKEN_OFFSET for t in out.outputs[0].token_ids] == ref
