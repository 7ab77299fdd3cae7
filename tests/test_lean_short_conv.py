"""``LeanShortConv``: LFM2's short convolutions with only the convolution eager follow the reference model's greedy
picks."""

import pytest
import torch

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl


@pytest.mark.engine
@pytest.mark.parametrize(
    ("lean", "eager"), [(True, False), (True, True), (False, False)], ids=["lean", "lean-eager", "vllm-short-conv"]
)
def test_lean_short_conv_engine_follows_the_reference_across_mixed_steps(tiny_parallel, capfd, lean, eager):
    """A 16-token step budget splits the longer prompt over steps beside the shorter one's decoding: prefills without
    and with a cached state, decodes, and steps that mix them, all through the lean layers (and, as the control,
    through vLLM's). Every codebook-1 token must be the reference model's greedy pick given the same prefix, up to
    the rounding of the platform's float32 path (``greedy_gaps``): the streams themselves may part where two logits
    are nearly tied."""
    if eager and not torch.cuda.is_available():
        pytest.skip("the CPU build runs every engine eagerly: the first case is this one")
    from vllm import LLM, SamplingParams

    from vllm_omni_kani.model_executor.layers.mamba.lean_short_conv import CONFIG_KEY
    from vllm_omni_kani.model_executor.models.kani_tts.modeling_hf import ParallelHeadLfm2ForCausalLM, greedy_gaps

    prompts = [tl.build_prompt([tl.START_OF_TEXT, *range(300, 300 + n)]) for n in (4, 31)]
    ref_model = ParallelHeadLfm2ForCausalLM.from_pretrained(tiny_parallel, dtype=torch.float32).eval()
    conv_layers = sum(kind == "conv" for kind in ref_model.config.layer_types)
    llm = LLM(
        model=str(tiny_parallel),
        dtype="float32",
        max_model_len=256,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        # On CUDA the piecewise graphs run around the lean op (what it is for) unless the case asks for eager layers
        # (the lean op's kernels alone); the CPU build runs eagerly.
        enforce_eager=eager or not torch.cuda.is_available(),
        kv_cache_memory_bytes=64 << 20,
        additional_config={CONFIG_KEY: lean},
    )
    params = SamplingParams(max_tokens=24, temperature=0.0, detokenize=False, stop_token_ids=[tl.END_OF_SPEECH])
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    announced = f"{CONFIG_KEY}: {conv_layers} short-conv layers keep only the convolution eager"
    assert (announced in "".join(capfd.readouterr())) is lean
    # Rounding of logits of this size. On CUDA vLLM's float32 attention runs Triton kernels whose matmuls round to
    # TF32 (10-bit mantissa, tl.dot's default): an H100 gave all three cases the same 1.0e-3 gap at one tied step.
    # A wrong step is off by O(1): a lean layer that drops the decode rows' state gives gaps of 0.5-3.7.
    eps = 2.0**-10 if torch.cuda.is_available() else torch.finfo(torch.float32).eps
    scale = ref_model.lm_head.weight.abs().max().item() * ref_model.config.hidden_size**0.5
    tolerance = 16 * eps * scale
    for prompt, out in zip(prompts, outputs, strict=True):
        tokens = list(out.outputs[0].token_ids)
        assert tokens
        gaps = greedy_gaps(ref_model, prompt, tokens)
        assert max(gaps) <= tolerance, f"steps whose token is not the reference's pick: {gaps} (tolerance {tolerance})"


def test_the_lean_op_is_a_splitting_op():
    """Piecewise compilation splits at the lean op as at vLLM's own ``short_conv``: the plugin adds it to the list
    every engine config's ``splitting_ops`` starts from."""
    from vllm.config.compilation import CompilationConfig

    from vllm_omni_kani import patch
    from vllm_omni_kani.model_executor.layers.mamba.lean_short_conv import SPLITTING_OP

    patch.split_graphs_at_the_lean_short_conv()
    assert SPLITTING_OP in CompilationConfig._attention_ops
    assert "vllm::short_conv" in CompilationConfig._attention_ops
    assert CompilationConfig._attention_ops.count(SPLITTING_OP) == 1


def test_a_non_boolean_switch_is_refused():
    from vllm_omni_kani.model_executor.layers.mamba.lean_short_conv import CONFIG_KEY, enabled

    assert enabled({}) is False
    assert enabled({CONFIG_KEY: True}) is True
    with pytest.raises(ValueError, match=CONFIG_KEY):
        enabled({CONFIG_KEY: "yes"})
