"""``LeanShortConv``: LFM2's short convolutions with only the convolution eager give the reference model's codes."""

import pytest
import torch

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl


@pytest.mark.engine
def test_lean_short_conv_engine_equals_reference_across_mixed_steps(tiny_parallel, capfd):
    """A 16-token step budget splits the longer prompt over steps beside the shorter one's decoding: prefills without
    and with a cached state, decodes, and steps that mix them, all through the lean layers; codebook 1 must be the
    reference model's greedy stream."""
    from vllm import LLM, SamplingParams

    from vllm_omni_kani.model_executor.layers.mamba.lean_short_conv import CONFIG_KEY
    from vllm_omni_kani.model_executor.models.kani_tts.modeling_hf import ParallelHeadLfm2ForCausalLM, generate_frames

    prompts = [tl.build_prompt([tl.START_OF_TEXT, *range(300, 300 + n)]) for n in (4, 31)]
    ref_model = ParallelHeadLfm2ForCausalLM.from_pretrained(tiny_parallel, dtype=torch.float32).eval()
    reference = [generate_frames(ref_model, p, 24)[:, 0].tolist() for p in prompts]
    conv_layers = sum(kind == "conv" for kind in ref_model.config.layer_types)
    llm = LLM(
        model=str(tiny_parallel),
        dtype="float32",
        max_model_len=256,
        max_num_seqs=2,
        max_num_batched_tokens=16,
        # On CUDA the piecewise graphs run around the lean op (what it is for); on the CPU build, eagerly.
        enforce_eager=not torch.cuda.is_available(),
        kv_cache_memory_bytes=64 << 20,
        additional_config={CONFIG_KEY: True},
    )
    params = SamplingParams(max_tokens=24, temperature=0.0, detokenize=False, stop_token_ids=[tl.END_OF_SPEECH])
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert f"{CONFIG_KEY}: {conv_layers} short-conv layers keep only the convolution eager" in "".join(
        capfd.readouterr()
    )
    for ref, out in zip(reference, outputs, strict=True):
        assert [t - tl.AUDIO_TOKEN_OFFSET for t in out.outputs[0].token_ids] == ref


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
