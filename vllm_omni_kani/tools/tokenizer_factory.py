"""A real byte-level BPE tokenizer whose control tokens sit at the Kani ids.

Text round-trips exactly (byte-level), BOS is added by the post-processor as in LFM2, and
ids between the trained vocabulary and ``TOKENISER_LENGTH`` are reserved placeholders, so
every id a Kani prompt uses means what it means in a trained checkpoint.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN = "<|pad|>", "<|startoftext|>", "<|endoftext|>"
# Enough merges to make common English words single tokens; the rest of the text range is reserved.
TRAINED_VOCAB_SIZE = 2048


def _corpus() -> list[str]:
    text = resources.files("vllm_omni_kani.tools").joinpath("bpe_corpus.txt").read_text()
    return [line for line in text.splitlines() if line.strip()]


def build_tokenizer() -> Tokenizer:
    """Train the BPE part deterministically, then pin reserved and control ids."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=TRAINED_VOCAB_SIZE,
        special_tokens=[PAD_TOKEN, BOS_TOKEN, EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(), trainer)
    spec = json.loads(tok.to_str())
    vocab: dict[str, int] = spec["model"]["vocab"]
    assert vocab[BOS_TOKEN] == tl.START_OF_TEXT and vocab[EOS_TOKEN] == tl.END_OF_TEXT
    for i in range(len(vocab), tl.TOKENISER_LENGTH):
        vocab[f"<|reserved_{i}|>"] = i
    for offset, name in enumerate(tl.CONTROL_TOKEN_NAMES):
        spec["added_tokens"].append(
            {
                "id": tl.TOKENISER_LENGTH + offset,
                "content": name,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
        )
        vocab[name] = tl.TOKENISER_LENGTH + offset
    out = Tokenizer.from_str(json.dumps(spec))
    out.post_processor = processors.TemplateProcessing(
        single=f"{BOS_TOKEN} $A",
        pair=f"{BOS_TOKEN} $A $B",
        special_tokens=[(BOS_TOKEN, tl.START_OF_TEXT)],
    )
    return out


def write_tokenizer(out_dir: Path) -> None:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` as transformers expects them."""
    build_tokenizer().save(str(out_dir / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "add_bos_token": True,
        "add_eos_token": False,
        "model_max_length": 128000,
        "clean_up_tokenization_spaces": False,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    special = {"bos_token": BOS_TOKEN, "eos_token": EOS_TOKEN, "pad_token": PAD_TOKEN}
    (out_dir / "special_tokens_map.json").write_text(json.dumps(special, indent=2) + "\n")
