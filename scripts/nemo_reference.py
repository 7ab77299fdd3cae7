"""Write tests/data/nanocodec/: NeMo's own decode of fixed seeded codes on factory codecs.

Run through ``bash scripts/nemo_reference.sh`` (it provides the NeMo venv). This half runs in .venv:
it writes the factory ``.nemo`` codecs and the codes, has ``scripts/nemo_decode.py`` decode them in
the NeMo venv, checks the native decoder against the result and stores everything the parity test
needs (codes, lengths, NeMo audio, a hash of each codec's decoder weights) plus a README.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import torch

from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import load_codec, read_decoder_tensors
from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS, write_nemo

REPO = Path(__file__).resolve().parents[1]
OUT = REPO / "tests" / "data" / "nanocodec"
TOKEN_SEED = 1234  # case i draws its codes from TOKEN_SEED + i
# name, codec preset, codec seed, valid frames per row (B = rows, T = longest)
CASES: list[tuple[str, str, int, list[int]]] = [
    ("tiny_b1_t33", "tiny", 0, [33]),
    ("tiny_b3_t12", "tiny", 0, [12, 7, 1]),
    ("tiny_seed1_b2_t6", "tiny", 1, [6, 2]),
    ("350m_b2_t5", "350m", 0, [5, 3]),
    ("350m_b1_t3", "350m", 0, [3]),
]


def decoder_hash(tensors: dict[str, torch.Tensor]) -> str:
    """sha256 over the decoder tensors (sorted names): tells a changed factory from a broken decoder."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().numpy().tobytes())
    return h.hexdigest()


def case_tokens(index: int, lengths: list[int]) -> torch.Tensor:
    """NeMo layout ``[B, 4, T]``, codes in [0, 4032)."""
    gen = torch.Generator().manual_seed(TOKEN_SEED + index)
    return torch.randint(0, CODEC_PRESETS["tiny"].codebook_size, (len(lengths), 4, max(lengths)), generator=gen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nemo-python", required=True, help="python of a venv with nemo_toolkit[tts]")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="nemo-ref-"))
    codecs = {(p, s): write_nemo(work / f"{p}-{s}.nemo", p, s) for _, p, s, _ in CASES}
    jobs, stored = [], {}
    for i, (name, preset, seed, lengths) in enumerate(CASES):
        tokens = case_tokens(i, lengths)
        np.save(work / f"{name}.npy", tokens.numpy())
        jobs.append(
            {"name": name, "nemo": str(codecs[preset, seed]), "tokens": str(work / f"{name}.npy"), "lengths": lengths}
        )
        stored[f"{name}.tokens"] = tokens.numpy().astype(np.int16)
        stored[f"{name}.lengths"] = np.array(lengths)
    (work / "jobs.json").write_text(json.dumps(jobs))
    subprocess.run(
        [args.nemo_python, str(REPO / "scripts" / "nemo_decode.py"), str(work / "jobs.json"), str(work / "nemo.npz")],
        check=True,
    )
    nemo = np.load(work / "nemo.npz")

    rows = []
    for name, preset, seed, lengths in CASES:
        decoder = load_codec(codecs[preset, seed])
        tokens = torch.from_numpy(stored[f"{name}.tokens"]).long()
        ours = decoder.decode(tokens.transpose(1, 2), torch.tensor(lengths))
        diff = (ours - torch.from_numpy(nemo[name])).abs().max().item()
        shown = f"{diff:.1e}" if diff else "0 (bit-identical)"
        rows.append(f"| `{name}` | {preset} | {seed} | {len(lengths)} | {max(lengths)} | {lengths} | {shown} |")
        print(f"{name}: max |native - NeMo| = {diff:.3g}")
        stored[f"{name}.audio"] = nemo[name]
    for preset, seed in codecs:
        stored[f"{preset}-{seed}.sha256"] = np.array(decoder_hash(read_decoder_tensors(codecs[preset, seed])))
    stored["cases"] = np.array(json.dumps([[n, p, s] for n, p, s, _ in CASES]))
    versions = {"nemo_version": str(nemo["nemo_version"]), "torch_version": str(nemo["torch_version"])}
    stored.update({k: np.array(v) for k, v in versions.items()})
    OUT.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(OUT / "nemo_reference.npz", **stored)
    (OUT / "README.md").write_text(README.format(rows="\n".join(rows), machine=platform.machine(), **versions))
    shutil.rmtree(work)
    print(f"wrote {OUT / 'nemo_reference.npz'}")


README = """# NeMo reference decodes for the NanoCodec parity tests

`nemo_reference.npz` holds NeMo's own `AudioCodecModel.decode(tokens, tokens_len)` of fixed codes on
codecs written by the checkpoint factory (`vllm_omni_kani.tools.codec_factory.write_nemo`: random
weights from a seeded generator). `tests/test_nanocodec_parity.py` rebuilds the same codecs from their
seeds, decodes the same codes natively and requires max |native − NeMo| ≤ 1e-4 (float32, CPU).

- Produced by: `bash scripts/nemo_reference.sh` (creates or reuses `.nemo-venv/`; `NEMO_VENV=…` points
  elsewhere), which runs `scripts/nemo_reference.py` in `.venv` and `scripts/nemo_decode.py` in the NeMo venv.
- NeMo: `nemo_toolkit[tts]=={nemo_version}` with torch {torch_version}, CPU ({machine}), float32; each
  `.nemo` loaded with `AudioCodecModel.restore_from` and checked to hold every weight of the model.
- Codes: `torch.randint(0, 4032, (B, 4, T), generator=torch.Generator().manual_seed(1234 + i))` for
  case `i`, NeMo's `[B, 4, T]` layout, stored as int16; rows past their length are padding.
- `<preset>-<seed>.sha256`: hash of the codec's decoder tensors, so a changed factory is reported as such.

| case | codec preset | codec seed | B | T | lengths (frames) | max abs diff at generation |
|---|---|---|---|---|---|---|
{rows}
"""

if __name__ == "__main__":
    main()
