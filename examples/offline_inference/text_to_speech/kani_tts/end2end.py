"""Offline Kani TTS with vLLM-Omni's Python API: texts in, wav files out.

    python examples/offline_inference/text_to_speech/kani_tts/end2end.py \
        --text "Hello there." --text "A second utterance." --max-new-tokens 120

Without ``--model`` a factory checkpoint (random weights: noise, but every stage runs for
real) is written under ``checkpoints/``; without ``--deploy-config`` the GPU or CPU YAML is
chosen automatically. Prints audio seconds and the real-time factor of each utterance.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import soundfile as sf


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", help="checkpoint directory (default: a factory checkpoint)")
    p.add_argument("--deploy-config", help="deploy YAML (default: stage_configs/kani_tts[_cpu].yaml)")
    p.add_argument("--text", action="append", help="text to speak (repeatable)")
    p.add_argument("--voice", help="speaker name from the checkpoint (default: its default speaker)")
    p.add_argument("--out-dir", default="kani_tts_output", help="where the wav files go")
    p.add_argument("--max-new-tokens", type=int, help="cap on Stage-0 tokens per utterance")
    p.add_argument("--temperature", type=float, help="default: the checkpoint's")
    p.add_argument("--seed", type=int, help="seed for reproducible sampling")
    return p.parse_args()


def main() -> None:
    args = parse_args()
    import vllm_omni_kani

    # vLLM-Omni resolves the pipeline before it loads plugins; register ours first.
    vllm_omni_kani.register()
    from transformers import AutoConfig, AutoTokenizer
    from vllm_omni.entrypoints.omni import Omni

    from vllm_omni_kani.deploy import default_checkpoint, default_deploy_config
    from vllm_omni_kani.entrypoints.openai.speech_request import MAX_SEGMENT_CHARS, resolve_speaker
    from vllm_omni_kani.entrypoints.openai.text_segments import split_text
    from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
    from vllm_omni_kani.model_executor.models.kani_tts.configuration import KaniTTSSettings

    model = Path(args.model) if args.model else default_checkpoint()
    deploy = Path(args.deploy_config) if args.deploy_config else default_deploy_config()
    texts = args.text or ["Hello! This is Kani speaking through vLLM-Omni.", "Every decode step is one audio frame."]
    settings = KaniTTSSettings.from_hf_config(AutoConfig.from_pretrained(model))
    speaker = resolve_speaker(args.voice, settings)
    tokenizer = AutoTokenizer.from_pretrained(model)

    omni = Omni(model=str(model), deploy_config=str(deploy))
    try:
        lm_params = omni.default_sampling_params_list[0].clone()
        lm_params.temperature = settings.sampling.temperature if args.temperature is None else args.temperature
        lm_params.top_p = settings.sampling.top_p
        lm_params.top_k = settings.sampling.top_k
        lm_params.repetition_penalty = settings.sampling.repetition_penalty
        lm_params.max_tokens = args.max_new_tokens or settings.sampling.max_new_frames * settings.tokens_per_frame
        lm_params.seed = args.seed
        lm_params.stop_token_ids = [tl.END_OF_SPEECH]
        params = [lm_params, *omni.default_sampling_params_list[1:]]

        out_dir = Path(args.out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        for n, text in enumerate(texts):
            segments = split_text(text, MAX_SEGMENT_CHARS)  # long text: sentence-aligned generations
            prompts = [{"prompt_token_ids": tl.text_prompt_ids(tokenizer, seg, speaker)} for seg in segments]
            start = time.perf_counter()
            outputs = sorted(omni.generate(prompts, params), key=lambda o: int(str(o.request_id).split("_")[0]))
            elapsed = time.perf_counter() - start
            audio = np.concatenate([_audio(o) for o in outputs]) if outputs else np.zeros(0, np.float32)
            path = out_dir / f"utterance_{n}.wav"
            sf.write(path, audio, settings.sample_rate)
            seconds = len(audio) / settings.sample_rate
            rtf = elapsed / seconds if seconds else float("inf")
            print(f"{path}: {seconds:.2f} s of audio in {elapsed:.2f} s (RTF {rtf:.3f}), {len(segments)} segment(s)")
    finally:
        omni.close()


def _audio(output) -> np.ndarray:
    """An output's float32 samples; a codec that hands over 16-bit PCM (``codec_pcm16_audio``) gives int16."""
    from vllm_omni_kani.entrypoints.openai.pcm16 import to_float

    audio = output.multimodal_output["audio"]
    parts = audio if isinstance(audio, list) else [audio]
    samples = [to_float(a.reshape(-1).cpu()).numpy() for a in parts]
    return np.concatenate(samples) if samples else np.zeros(0, np.float32)


if __name__ == "__main__":
    main()
