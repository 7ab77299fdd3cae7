"""Speech answers are encoded to 16-bit PCM with numpy instead of soundfile: the same bytes as the installed
libsndfile for raw PCM and WAV, at the edges (full scale, clipping, NaN, infinities) and on random audio, and the API
server's ``create_audio`` gives the same answers as vLLM-Omni's own for every format, speed and encoding."""

from __future__ import annotations

import numpy as np

from tests.conftest import run_python
from vllm_omni_kani.entrypoints.openai import pcm16

# A process that loaded the speech server (the patch's guard), with the encoder's request type.
SERVER_IMPORTS = (
    "import numpy as np\n"
    "import vllm_omni.entrypoints.openai.serving_speech\n"
    "from vllm_omni.entrypoints.openai.audio_utils_mixin import AudioMixin\n"
    "from vllm_omni.entrypoints.openai.protocol.audio import CreateAudio\n"
    "from vllm_omni_kani import patch\n"
)


def test_the_numpy_encoding_writes_libsndfile_s_bytes():
    assert pcm16.matches_soundfile(seed=0)
    assert pcm16.matches_soundfile(seed=1)


def test_full_scale_clipping_and_nan_land_where_libsndfile_puts_them():
    x = np.array([1.0, -1.0, 1.5, -1.5, np.nan, np.inf, -np.inf, 0.5, -1e-5, 0.0], dtype=np.float32)
    assert pcm16.pcm16(x).tolist() == [32767, -32768, 32767, -32768, -32768, 32767, -32768, 16384, -1, 0]


def test_the_server_s_create_audio_answers_as_vllm_omni_s_own():
    """In a process that loaded the speech server (the patch's guard), before and after the patch: pcm and wav,
    mono and [T, C] and [2, T], base64 or not, float32 and float64, take the numpy path or vLLM-Omni's; other
    formats and speeds pass through unchanged."""
    code = SERVER_IMPORTS + (
        "rng = np.random.default_rng(0)\n"
        "mono = rng.uniform(-1.1, 1.1, 4410).astype(np.float32)\n"
        "audios = [mono, mono.astype(np.float64), mono.reshape(-1, 2), mono.reshape(2, -1), mono[:0]]\n"
        "cases = [(a, f, s, b) for a in audios for f in ('pcm', 'wav', 'PCM', 'flac') for s in (1.0, 1.25)\n"
        "         for b in (False, True) if not (s != 1.0 and a.size == 0) and not (f == 'flac' and a.size == 0)]\n"
        "def answers():\n"
        "    out = []\n"
        "    for audio, fmt, speed, b64 in cases:\n"
        "        r = AudioMixin().create_audio(CreateAudio(audio_tensor=audio, sample_rate=22050,\n"
        "            response_format=fmt, speed=speed, base64_encode=b64))\n"
        "        out.append((r.audio_data, r.media_type))\n"
        "    return out\n"
        "before, own = answers(), AudioMixin.create_audio\n"
        "assert patch.encode_pcm_with_numpy()\n"
        "assert AudioMixin.create_audio is not own and AudioMixin.create_audio.__wrapped__ is own\n"
        "after = answers()\n"
        "assert len(before) == len(after) > 40\n"
        "for case, b, a in zip(cases, before, after):\n"
        "    assert a == b, (case[0].shape, case[0].dtype, case[1:])\n"
        "print('answers', len(after))\n"
    )
    out = run_python(code)
    assert "answers" in out.stdout


def test_a_patch_listed_in_kani_disable_patches_is_left_unapplied():
    code = (
        "import vllm_omni.entrypoints.openai.serving_speech\n"
        "from vllm_omni.entrypoints.openai.audio_utils_mixin import AudioMixin\n"
        "own = AudioMixin.create_audio\n"
        "from vllm_omni_kani import patch\n"
        "assert not patch.encode_pcm_with_numpy() and AudioMixin.create_audio is own\n"
        "print('left alone')\n"
    )
    env = {"KANI_DISABLE_PATCHES": "some_other_patch, encode_pcm_with_numpy"}
    assert "left alone" in run_python(code, env=env).stdout


def test_the_torch_encoding_is_the_numpy_one_and_int16_turns_back_exactly():
    """``pcm16_tensor`` (the codec stage's, on its device) gives ``pcm16``'s values on the probe's edges, near every
    step boundary and on random audio, in both float types; ``to_float`` of that PCM encodes to the same PCM again."""
    import torch

    rng = np.random.default_rng(2)
    edges = [0.0, -0.0, 1.0, -1.0, 1.5, -1.5, 1e30, -1e30, 2.0**-16, -(2.0**-16), 3.0 * 2.0**-17, np.inf, -np.inf]
    steps = rng.integers(-32768, 32768, 2000) * 2.0**-15
    for ftype in pcm16.FLOAT_TYPES:
        below = np.nextafter(steps.astype(ftype), ftype(-2))
        noise = rng.uniform(-1.2, 1.2, 20_000).astype(ftype)
        x = np.concatenate([np.array([*edges, np.nan], ftype), steps.astype(ftype), below, noise])
        want = pcm16.pcm16(x)
        got = pcm16.pcm16_tensor(torch.from_numpy(x))
        assert got.dtype == torch.int16 and np.array_equal(got.numpy(), want)
        again = pcm16.to_float(got)
        assert again.dtype == torch.float32 and np.array_equal(pcm16.pcm16(again.numpy()), want)
    floats = torch.tensor([0.25, -0.5], dtype=torch.float64)
    assert pcm16.to_float(floats).dtype == torch.float32


def test_int16_audio_is_answered_as_its_own_bytes():
    """The server's encoder takes int16 audio (a ``codec_pcm16_audio`` codec's) as PCM: its bytes for pcm and wav,
    the same answer as soundfile writes for that int16 and as the float samples it came from."""
    code = SERVER_IMPORTS + (
        "from vllm_omni_kani.entrypoints.openai.pcm16 import pcm16\n"
        "x = np.random.default_rng(0).uniform(-1.1, 1.1, 4410).astype(np.float32)\n"
        "pcm = pcm16(x)\n"
        "def answer(audio, fmt):\n"
        "    return AudioMixin().create_audio(CreateAudio(audio_tensor=audio, sample_rate=22050,\n"
        "        response_format=fmt, speed=1.0, base64_encode=False)).audio_data\n"
        "own = {f: answer(pcm, f) for f in ('pcm', 'wav')}\n"
        "assert patch.encode_pcm_with_numpy()\n"
        "for f in ('pcm', 'wav'):\n"
        "    assert answer(pcm, f) == own[f] == answer(x, f), f\n"
        "assert answer(pcm, 'pcm') == pcm.tobytes()\n"
        "print('int16 answered')\n"
    )
    assert "int16 answered" in run_python(code).stdout
