"""Decode codes with NeMo itself (runs in the NeMo venv, imports nothing from this project).

    python scripts/nemo_decode.py jobs.json out.npz

``jobs.json``: ``[{"name", "nemo", "tokens" (.npy, int64 [B, 4, T]), "lengths" [B]}]``. Each ``.nemo``
is restored with ``AudioCodecModel.restore_from`` and must hold every weight the model has (only the
loss modules' fixed buffers may be absent). ``out.npz`` gets ``<name>`` = float32 audio ``[B, T·1764]``
and the NeMo / torch versions.
"""

from __future__ import annotations

import io
import json
import sys
import tarfile
from pathlib import Path

import nemo
import numpy as np
import torch
from nemo.collections.tts.models import AudioCodecModel

DERIVED_BUFFERS = ("mel_loss_fn.", "stft_loss_fn.")  # rebuilt from the config, never trained


def restore(path: str) -> AudioCodecModel:
    model = AudioCodecModel.restore_from(path, map_location=torch.device("cpu")).eval()
    with tarfile.open(path) as tar:
        member = next(m for m in tar.getmembers() if m.name.endswith("model_weights.ckpt"))
        stored = torch.load(io.BytesIO(tar.extractfile(member).read()), map_location="cpu", weights_only=True)
    expected = model.state_dict()
    missing = [k for k in expected if k not in stored and not k.startswith(DERIVED_BUFFERS)]
    unexpected = [k for k in stored if k not in expected]
    wrong = [k for k in stored if k in expected and stored[k].shape != expected[k].shape]
    if missing or unexpected or wrong:
        sys.exit(f"{path}: missing {missing[:5]}, unexpected {unexpected[:5]}, wrong shape {wrong[:5]}")
    return model


def main(jobs_path: str, out_path: str) -> None:
    jobs = json.loads(Path(jobs_path).read_text())
    models: dict[str, AudioCodecModel] = {}
    out = {"nemo_version": np.array(nemo.__version__), "torch_version": np.array(torch.__version__)}
    for job in jobs:
        if job["nemo"] not in models:
            models[job["nemo"]] = restore(job["nemo"])
        model = models[job["nemo"]]
        tokens = torch.from_numpy(np.load(job["tokens"]))
        with torch.inference_mode():
            audio, audio_len = model.decode(tokens=tokens, tokens_len=torch.tensor(job["lengths"]))
        assert audio_len.tolist() == [n * model.samples_per_frame for n in job["lengths"]]
        out[job["name"]] = audio.float().numpy().copy()  # plain array: NeMo tags its outputs
        print(f"{job['name']}: tokens {tuple(tokens.shape)} -> audio {tuple(audio.shape)}")
    np.savez(out_path, **out)


if __name__ == "__main__":
    main(*sys.argv[1:])
