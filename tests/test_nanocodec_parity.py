"""The native decoder reproduces NeMo's ``AudioCodecModel.decode``: max |native − NeMo| ≤ 1e-4, float32.

By default the comparison is against stored NeMo outputs (``tests/data/nanocodec/``, made by
``bash scripts/nemo_reference.sh``): the factory codecs are rebuilt from their seeds and the stored
codes are decoded natively — tiny codec for several B and T, the real-size (31.5M-parameter) decoder
for short T. When a NeMo venv exists (``.nemo-venv/`` or ``$NEMO_VENV``), ``test_live_nemo_parity``
also runs NeMo itself on a freshly written codec; without one it is skipped.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLES_PER_FRAME
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import (
    NanoCodecDecoder,
    load_codec,
    load_decoder_state,
    read_decoder_tensors,
)
from vllm_omni_kani.model_executor.models.kani_tts.token_layout import CODEBOOK_SIZE
from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS, random_decoder_tensors, write_nemo

REPO = Path(__file__).resolve().parents[1]
REFERENCE = REPO / "tests" / "data" / "nanocodec" / "nemo_reference.npz"
TOLERANCE = 1e-4


@pytest.fixture(scope="module")
def reference():
    return np.load(REFERENCE)


def _hash(tensors: dict[str, torch.Tensor]) -> str:
    import hashlib

    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().numpy().tobytes())
    return h.hexdigest()


@pytest.fixture(scope="module")
def factory_decoder(reference, tmp_path_factory):
    """The factory codec of (preset, seed), built once. The tiny codec goes through the real file path
    (.nemo → load_codec); the real-size one is rebuilt in memory from the same generator (no 250 MB file)."""
    cache: dict[tuple[str, int], NanoCodecDecoder] = {}

    def build(preset: str, seed: int) -> NanoCodecDecoder:
        if (preset, seed) not in cache:
            if preset == "tiny":
                path = write_nemo(tmp_path_factory.mktemp("codec") / "codec.nemo", preset, seed)
                tensors = read_decoder_tensors(path)
                decoder = load_codec(path)
            else:
                tensors = random_decoder_tensors(CODEC_PRESETS[preset], seed)
                decoder = NanoCodecDecoder(CODEC_PRESETS[preset])
                load_decoder_state(decoder, tensors)
            stored = str(reference[f"{preset}-{seed}.sha256"])
            assert _hash(tensors) == stored, "the factory's codec changed: run bash scripts/nemo_reference.sh"
            cache[preset, seed] = decoder.eval()
        return cache[preset, seed]

    return build


def _cases() -> list[tuple[str, str, int]]:
    return [tuple(c) for c in json.loads(str(np.load(REFERENCE)["cases"]))]


@pytest.mark.parametrize(("name", "preset", "seed"), _cases(), ids=[c[0] for c in _cases()])
def test_matches_stored_nemo_decode(reference, factory_decoder, name, preset, seed):
    decoder = factory_decoder(preset, seed)
    tokens = torch.from_numpy(reference[f"{name}.tokens"]).long()  # NeMo layout [B, 4, T]
    lengths = torch.from_numpy(reference[f"{name}.lengths"])
    ours = decoder.decode(tokens.transpose(1, 2), lengths)
    nemo = torch.from_numpy(reference[f"{name}.audio"])
    assert ours.shape == nemo.shape == (tokens.shape[0], tokens.shape[2] * SAMPLES_PER_FRAME)
    assert (ours - nemo).abs().max().item() <= TOLERANCE


def _nemo_python() -> Path | None:
    venv = Path(os.environ.get("NEMO_VENV", REPO / ".nemo-venv"))
    python = venv / "bin" / "python"
    return python if python.is_file() else None


@pytest.mark.skipif(_nemo_python() is None, reason="no NeMo venv (.nemo-venv or $NEMO_VENV): stored references only")
def test_live_nemo_parity(tmp_path):
    """NeMo restores a codec the factory just wrote and decodes fresh codes; the native decode agrees."""
    nemo_path = write_nemo(tmp_path / "live.nemo", "tiny", 7)
    lengths = [31, 9]
    tokens = torch.randint(0, CODEBOOK_SIZE, (2, 4, 31), generator=torch.Generator().manual_seed(99))
    np.save(tmp_path / "tokens.npy", tokens.numpy())
    job = {"name": "live", "nemo": str(nemo_path), "tokens": str(tmp_path / "tokens.npy"), "lengths": lengths}
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    script = REPO / "scripts" / "nemo_decode.py"
    subprocess.run(
        [str(_nemo_python()), str(script), str(tmp_path / "jobs.json"), str(tmp_path / "out.npz")], check=True
    )
    nemo = torch.from_numpy(np.load(tmp_path / "out.npz")["live"])
    ours = load_codec(nemo_path).decode(tokens.transpose(1, 2), torch.tensor(lengths))
    assert (ours - nemo).abs().max().item() <= TOLERANCE
