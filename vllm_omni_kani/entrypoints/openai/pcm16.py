"""16-bit PCM (raw and WAV) of a float waveform: the bytes libsndfile writes, computed with numpy.

vLLM-Omni encodes every streamed chunk, and every whole WAV answer, with ``soundfile.write`` into a ``BytesIO``:
about 150 µs per second of 22,050 Hz audio, 22% of the API server's main thread at 256 streams (docs/BENCHMARKS.md,
eighth set). The numpy form takes about 30 µs. libsndfile scales a float to 32 bits (× 2**31, rounded to even),
keeps the top 16 (a floor) and saturates, NaN to the most negative value; the numpy form does the same steps in the
input's own float type, and ``matches_soundfile`` checks that claim against the installed libsndfile before anything
relies on it.

``pcm16_tensor`` takes the same steps in torch, where the audio is made: a codec stage that hands its audio over as
16-bit PCM (``codec_pcm16_audio``) does it on its device, so the API server only copies bytes, and half as many bytes
cross the stages. The API server takes int16 arrays as that PCM, and ``to_float`` turns them back into samples
exactly (k / 32768 is k again in 16 bits) where it needs float: resampling, other formats.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import torch

PCM16_MIN, PCM16_MAX = -32768, 32767
FLOAT_TYPES = (np.float32, np.float64)
PCM16_SCALE = 32768.0  # one 16-bit step is 1 / 32768 of full scale
_WAV_HEADER_BYTES = 44  # RIFF + fmt (16-byte PCM format chunk) + data chunk header


def pcm16(samples: np.ndarray) -> np.ndarray:
    """Float32/float64 samples (any shape, nominal range [-1, 1]) → little-endian int16 of the same shape."""
    x = np.asarray(samples)
    ftype = x.dtype.type
    with np.errstate(over="ignore", invalid="ignore"):  # huge values become inf and saturate below
        scaled = np.rint(x * ftype(2.0**31))  # exact: a power-of-two scale, then round half to even
        scaled *= ftype(2.0**-16)
        np.floor(scaled, out=scaled)
        np.fmax(scaled, PCM16_MIN, out=scaled)  # fmax takes the number over NaN: NaN → -32768, as libsndfile
        np.minimum(scaled, PCM16_MAX, out=scaled)
    return scaled.astype("<i2")


def pcm16_tensor(samples: torch.Tensor) -> torch.Tensor:
    """``pcm16`` in torch, on the samples' device: float32/float64 → int16 of the same shape, the same values."""
    scaled = torch.round(samples * (2.0**31))  # round half to even, as np.rint
    scaled.mul_(2.0**-16).floor_()
    scaled.nan_to_num_(nan=PCM16_MIN)  # NaN → -32768, as libsndfile; then saturate
    return scaled.clamp_(PCM16_MIN, PCM16_MAX).to(torch.int16)


def to_float(samples: torch.Tensor) -> torch.Tensor:
    """Float32 samples of a waveform that may be 16-bit PCM (int16, as ``pcm16_tensor`` makes it); float as is."""
    if samples.dtype == torch.int16:
        return samples.float().div_(PCM16_SCALE)
    return samples.float()


def pcm16_bytes(samples: np.ndarray) -> bytes:
    """Raw 16-bit PCM of ``samples`` (``[T]`` mono or ``[T, C]`` interleaved), as ``soundfile`` RAW PCM_16; int16
    samples are that PCM already."""
    if samples.dtype == np.int16:
        return samples.astype("<i2", copy=False).tobytes()
    return pcm16(samples).tobytes()


def wav_bytes(samples: np.ndarray, sample_rate: int) -> bytes:
    """A whole 16-bit PCM WAV file of ``samples`` (``[T]`` or ``[T, C]``) at ``sample_rate`` Hz, as ``soundfile``."""
    channels = 1 if samples.ndim == 1 else samples.shape[1]
    data = pcm16_bytes(samples)
    header = struct.pack(
        "<4sI4s4sIHHIIHH4sI",
        b"RIFF",
        _WAV_HEADER_BYTES - 8 + len(data),
        b"WAVE",
        b"fmt ",
        16,  # PCM format chunk size
        1,  # WAVE_FORMAT_PCM
        channels,
        sample_rate,
        sample_rate * channels * 2,  # bytes per second
        channels * 2,  # bytes per frame
        16,  # bits per sample
        b"data",
        len(data),
    )
    return header + data


def matches_soundfile(seed: int = 0) -> bool:
    """Whether ``pcm16_bytes`` and ``wav_bytes`` equal the installed libsndfile's output on a probe of every edge
    (±1, just inside and outside, ties, tiny values, ±inf, NaN, huge) and of random samples, in both float types."""
    import soundfile

    rng = np.random.default_rng(seed)
    edges = [0.0, -0.0, 1.0, -1.0, 0.99999, -0.99999, 1.5, -1.5, 1e30, -1e30, 1e-5, -1e-5, 0.5, -0.5, 2.0**-16]
    edges += [2.0**-15, -(2.0**-16), 3.0 * 2.0**-17, np.inf, -np.inf, np.nan, -np.nan]
    for ftype in FLOAT_TYPES:
        probe = np.concatenate(
            [
                np.array(edges, dtype=ftype),
                rng.uniform(-1.2, 1.2, 50_000).astype(ftype),
                rng.uniform(-1e-3, 1e-3, 50_000).astype(ftype),
            ]
        )
        for samples in (probe, probe.reshape(-1, 2)):
            raw, wav = io.BytesIO(), io.BytesIO()
            soundfile.write(raw, samples, 22_050, format="RAW", subtype="PCM_16")
            soundfile.write(wav, samples, 22_050, format="WAV")
            if raw.getvalue() != pcm16_bytes(samples) or wav.getvalue() != wav_bytes(samples, 22_050):
                return False
    return True
