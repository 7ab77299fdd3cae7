"""The official Kani-TTS model code as a reference, run in its own environment (`scripts/kani_reference_env.sh`).

The official packages import NeMo at package import, so their files are loaded by path: `model.py` of
kani-tts-2 0.0.5 (``KaniTTS2ForCausalLM``), its `speaker_embedder.py` (``SpeakerEmbedder``), and `core.py` of
kani-tts 1.0.1 / kani-tts-2 0.0.5 with NeMo stubbed out (only their prompt builders are used). The Kani grammar
comes from this repository's `speech_mask.py` (torch only), so both sides enforce it the same way.

    python kani_reference.py write  SPEC.json OUT_DIR          # random-weight Kani-TTS-2 checkpoint
    python kani_reference.py greedy CKPT JOBS.json OUT.json    # greedy token ids per job
    python kani_reference.py prompt {v1,v2} CKPT JOBS.json OUT.json   # the official prompt ids per job
    python kani_reference.py embed  SPEAKER_MODEL JOBS.json OUT.json  # SpeakerEmbedder output per job
"""

from __future__ import annotations

import importlib.util
import json
import sys
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl  # noqa: E402
from vllm_omni_kani.model_executor.models.kani_tts.speech_mask import SpeechMask  # noqa: E402


def _official_dir(version: str) -> Path:
    venv = Path(sys.prefix)
    if version == "v1":
        return venv / "kani-tts-v1" / "kani_tts"
    return Path(next(p for p in sys.path if (Path(p) / "kani_tts" / "model.py").is_file())) / "kani_tts"


def _load(version: str, name: str) -> types.ModuleType:
    """One file of the official package, as a module of a stand-in package (so its relative imports work)."""
    package = f"kani_tts_{version}"
    if package not in sys.modules:
        pkg = types.ModuleType(package)
        pkg.__path__ = [str(_official_dir(version))]
        sys.modules[package] = pkg
        # core.py imports NeMo's codec at module level; the prompt builders never touch it.
        for mod in ("nemo", "nemo.collections", "nemo.collections.tts", "nemo.collections.tts.models"):
            sys.modules.setdefault(mod, types.ModuleType(mod))
        sys.modules["nemo.collections.tts.models"].AudioCodecModel = object
    full = f"{package}.{name}"
    if full not in sys.modules:
        spec = importlib.util.spec_from_file_location(full, _official_dir(version) / f"{name}.py")
        module = importlib.util.module_from_spec(spec)
        sys.modules[full] = module
        spec.loader.exec_module(module)
    return sys.modules[full]


def write(spec_path: str, out: str) -> None:
    """A random-weight checkpoint saved by the official class (random RoPE scales too, so that every layer has
    its own α)."""
    from transformers import GenerationConfig, Lfm2Config

    spec = json.loads(Path(spec_path).read_text())
    v2 = spec.pop("kani_tts2")
    config = Lfm2Config(**spec)
    for key, value in v2.items():
        setattr(config, key, value)
    config.architectures = ["KaniTTS2ForCausalLM"]
    torch.manual_seed(v2.get("seed", 0))
    model_module = _load("v2", "model")
    model = model_module.KaniTTS2ForCausalLM(
        config,
        audio_tokens_start=tl.AUDIO_TOKEN_OFFSET,
        tokens_per_frame=v2["tokens_per_frame"],
        audio_step=v2["audio_step"],
        use_learnable_rope=v2["use_learnable_rope"],
        alpha_min=v2["alpha_min"],
        alpha_max=v2["alpha_max"],
        speaker_emb_dim=v2["speaker_emb_dim"],
    )
    with torch.no_grad():
        for layer in model.model.learnable_rope_layers or ():
            if layer is not None:
                layer.alpha_weight.copy_(torch.randn(()) * 1.5)
    model.generation_config = GenerationConfig(
        bos_token_id=tl.START_OF_TEXT, eos_token_id=tl.END_OF_SPEECH, pad_token_id=tl.PAD
    )
    model.save_pretrained(out, safe_serialization=True)


class _Grammar:
    """The Kani grammar after each row's last token, END_OF_SPEECH banned (fixed-length comparisons)."""

    def __init__(self, vocab: int):
        self.mask = SpeechMask(vocab, "flattened")

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        scores = self.mask.apply(scores, self.mask.phases(input_ids[:, -1]))
        scores[:, tl.END_OF_SPEECH] = float("-inf")
        return scores


def _official_model(ckpt: str):
    model_module = _load("v2", "model")
    # As the official KaniModel loads it: the audio start is the layout's, everything else from config.json.
    model = model_module.KaniTTS2ForCausalLM.from_pretrained(
        ckpt, audio_tokens_start=tl.AUDIO_TOKEN_OFFSET, device_map="cpu"
    )
    return model_module, model.float().eval()


@torch.no_grad()
def _greedy_forward(model_module, model, prompt: list[int], speaker: list[float] | None, steps: int) -> list[int]:
    """Greedy decoding with the official forward over the whole sequence each step: the speaker embedding
    projected and inserted at index 1 (as the official generate does), frame-level positions from the
    official ``compute_frame_level_positions`` over the sequence with that row counted as one text token."""
    inner = model.model
    grammar = _Grammar(model.config.vocab_size)
    ids = list(prompt)
    for _ in range(steps):
        tokens = torch.tensor([ids])
        embeds = inner.embed_tokens(tokens)
        slotted = tokens
        if speaker is not None:
            row = inner.speaker_emb_projection(torch.tensor([speaker], dtype=embeds.dtype))[:, None]
            embeds = torch.cat([embeds[:, :1], row, embeds[:, 1:]], dim=1)
            slotted = torch.cat([tokens[:, :1], torch.tensor([[tl.SPEAKER_EMBEDDING_SLOT]]), tokens[:, 1:]], dim=1)
        positions = model_module.compute_frame_level_positions(
            slotted, model.audio_tokens_start, model.tokens_per_frame, model.audio_step
        )
        # An all-ones mask keeps transformers from reading repeated positions as packed sequences.
        mask = torch.ones(positions.shape, dtype=torch.long)
        hidden = inner(inputs_embeds=embeds, position_ids=positions, attention_mask=mask, use_cache=False)
        logits = model.lm_head(hidden.last_hidden_state[:, -1]).float()
        ids.append(int(grammar(tokens, logits).argmax()))
    return ids[len(prompt) :]


@torch.no_grad()
def _greedy_generate(model, prompt: list[int], steps: int) -> list[int]:
    """The official ``generate()`` (KV cache, its own position tracking), greedy, same grammar."""
    from transformers import LogitsProcessorList

    tokens = torch.tensor([prompt])
    out = model.generate(
        input_ids=tokens,
        attention_mask=torch.ones_like(tokens),
        max_new_tokens=steps,
        min_new_tokens=steps,
        do_sample=False,
        logits_processor=LogitsProcessorList([_Grammar(model.config.vocab_size)]),
    )
    return out[0, len(prompt) :].tolist()


def greedy(ckpt: str, jobs_path: str, out: str) -> None:
    model_module, model = _official_model(ckpt)
    results = []
    for job in json.loads(Path(jobs_path).read_text()):
        result = {"forward": _greedy_forward(model_module, model, job["prompt"], job.get("speaker"), job["steps"])}
        if job.get("speaker") is None:
            result["generate"] = _greedy_generate(model, job["prompt"], job["steps"])
        results.append(result)
    Path(out).write_text(json.dumps(results))


def prompt(version: str, ckpt: str, jobs_path: str, out: str) -> None:
    """``KaniModel.get_input_ids`` of the official package (v1: speaker prefix; v2: language tag)."""
    from transformers import AutoTokenizer

    core = _load(version, "core")
    kani = core.KaniModel.__new__(core.KaniModel)  # only the prompt builder: no model, no codec
    kani.tokenizer = AutoTokenizer.from_pretrained(ckpt)
    kani.player = types.SimpleNamespace(
        start_of_human=tl.START_OF_HUMAN, end_of_text=tl.END_OF_TEXT, end_of_human=tl.END_OF_HUMAN
    )
    results = []
    for job in json.loads(Path(jobs_path).read_text()):
        ids, _ = kani.get_input_ids(job["text"], job.get("speaker") if version == "v1" else job.get("language"))
        results.append(ids[0].tolist())
    Path(out).write_text(json.dumps(results))


def embed(model_dir: str, jobs_path: str, out: str) -> None:
    """``SpeakerEmbedder.embed_audio`` per job (``{"audio": NPY, "sample_rate": HZ}``, samples ``[T]`` or
    ``[channels, T]`` as the official embedder takes them); the weights must load with nothing missing or left over."""
    import numpy as np

    module = _load("v2", "speaker_embedder")
    _, info = module.EmbeddingsModel.from_pretrained(model_dir, output_loading_info=True)
    leftovers = {k: v for k, v in info.items() if v}
    if leftovers:
        raise SystemExit(f"the speaker model does not load cleanly into the official class: {leftovers}")
    embedder = module.SpeakerEmbedder(model_name=model_dir, device="cpu")
    results = []
    for job in json.loads(Path(jobs_path).read_text()):
        audio = np.load(job["audio"])
        results.append(embedder.embed_audio(audio, sample_rate=job["sample_rate"])[0].tolist())
    Path(out).write_text(json.dumps(results))


if __name__ == "__main__":
    command, *args = sys.argv[1:]
    {"write": write, "greedy": greedy, "prompt": prompt, "embed": embed}[command](*args)
