"""The native NanoCodec decoder: receptive field, streaming, batching, loading, errors, precision.

Everything runs on the factory's tiny codec (real rates, kernels and dilations; 96 base channels).
"""

from __future__ import annotations

import json

import pytest
import torch

from vllm_omni_kani.model_executor.models.kani_tts.configuration import KaniConfigError, KaniTTSSettings
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import (
    DEFAULT_CONFIG,
    RECEPTIVE_FIELD_FRAMES,
    CodecConfigError,
    NanoCodecConfig,
    convert_nemo,
    find_codec,
    load_codec,
    read_decoder_tensors,
    save_codec,
)
from vllm_omni_kani.tools.codec_factory import CODEC_PRESETS

SPF = DEFAULT_CONFIG.samples_per_frame


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ckpt(make_ckpt):
    return make_ckpt("parallel")


@pytest.fixture(scope="module")
def codec(ckpt):
    return load_codec(ckpt)


def assert_close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Same shape, max |difference| ≤ 1e-4 (the parity bar; batch shape changes CPU conv blocking)."""
    torch.testing.assert_close(actual, expected, atol=1e-4, rtol=0)


def random_codes(frames: int, batch: int | None = None, seed: int = 0) -> torch.Tensor:
    shape = (frames, 4) if batch is None else (batch, frames, 4)
    return torch.randint(0, DEFAULT_CONFIG.codebook_size, shape, generator=torch.Generator().manual_seed(seed))


def test_receptive_field_is_28_frames():
    """48,286 samples = 27.37 frames of left extent → 28 whole frames; the first 658 samples of a frame
    reach back 28 frames, the rest 27."""
    config = DEFAULT_CONFIG
    assert config.receptive_field_samples == 48_286
    assert config.receptive_field_samples / SPF == pytest.approx(27.373, abs=1e-3)
    assert RECEPTIVE_FIELD_FRAMES == config.receptive_field_frames == 28
    frame = 100
    reach = [frame - config.earliest_frame(frame * SPF + offset) for offset in range(SPF)]
    assert reach == [28] * 658 + [27] * (SPF - 658)
    assert CODEC_PRESETS["tiny"].receptive_field_frames == 28


def test_receptive_field_by_autograd(ckpt):
    """Which latent frames each output sample actually depends on (float64 gradients): exactly the cone."""
    decoder = load_codec(ckpt, dtype=torch.float64)
    frames, f = 36, 33
    latents = decoder.fsq_table[random_codes(frames)].reshape(1, frames, 16).transpose(1, 2).clone()
    latents.requires_grad_(True)
    audio = decoder.decode_latents(latents)[0]
    for offset, reach in ((0, 28), (657, 28), (658, 27), (SPF - 1, 27)):
        (grad,) = torch.autograd.grad(audio[f * SPF + offset], latents, retain_graph=True)
        depends = grad.abs().sum(1)[0].nonzero().flatten().tolist()
        assert depends == list(range(f - reach, f + 1)), offset


@pytest.mark.parametrize("chunk", [1, 2, 3, 4, 7, 16, 25, 33, 50])
def test_streaming_with_28_frames_of_context_equals_full_decode(codec, chunk):
    # Enough frames that every chunk size has windows with the full 28 frames of context.
    frames = 78 if chunk > 16 else 44
    codes = random_codes(frames, seed=chunk)
    full = codec.decode(codes[None])[0]
    pieces = []
    for start in range(0, frames, chunk):
        left = min(RECEPTIVE_FIELD_FRAMES, start)
        window = codes[start - left : start + chunk]
        pieces.append(codec.decode_window(window, left))
        assert pieces[-1].shape == ((window.shape[0] - left) * SPF,)
    streamed = torch.cat(pieces)
    assert streamed.shape == full.shape
    assert_close(streamed, full)


# float64 rounding bar for two decodes of different lengths: the CPU picks conv kernels (blocking, vector width,
# FMA use) by shape and by vendor, so a window and a full decode of the same frames may differ in the last bits
# (0 on Intel Xeon, last-bit differences reported on AMD EPYC). 1,000 ulps of a sample in [-1, 1] is far above
# any rounding of a ~100-layer decode and far below the 1.5e-2 a 15-frame window misses.
FLOAT64_WINDOW_ATOL = 1000 * torch.finfo(torch.float64).eps


def test_less_context_than_the_receptive_field_differs(ckpt):
    """float64, so that rounding cannot hide the far dependence: 28 frames of context are exact,
    27 are not — and only the first 658 samples of the first new frame change, as the cone says.

    Exactness is asserted only between two decodes of the same shape (same kernels, so equal inputs give equal
    bits on any CPU): changing the frame 28 frames back moves exactly the first 658 samples, changing the one 29
    frames back moves nothing. A window against the full decode (different shapes) is held to rounding only.
    """
    decoder = load_codec(ckpt, dtype=torch.float64)
    codes = random_codes(48, seed=1)
    f0 = 40
    full = decoder.decode(codes[None])[0][f0 * SPF : (f0 + 3) * SPF]

    def full_with_frame_changed(back: int) -> torch.Tensor:
        other = codes.clone()
        other[f0 - back] = (other[f0 - back] + 1) % DEFAULT_CONFIG.codebook_size
        return decoder.decode(other[None])[0][f0 * SPF : (f0 + 3) * SPF]

    moved = (full_with_frame_changed(28) - full).abs()
    assert moved[:658].max() > 0  # a 27-frame window cannot see this frame: it would miss this change
    assert moved[658:].max() == 0
    assert torch.equal(full_with_frame_changed(29), full)  # a 28-frame window sees everything that matters

    exact = decoder.decode_window(codes[f0 - 28 : f0 + 3], 28)
    torch.testing.assert_close(exact, full, atol=FLOAT64_WINDOW_ATOL, rtol=0)
    short = (decoder.decode_window(codes[f0 - 27 : f0 + 3], 27) - full).abs()
    torch.testing.assert_close(short[658:], torch.zeros_like(short[658:]), atol=FLOAT64_WINDOW_ATOL, rtol=0)
    kani_lookback = (decoder.decode_window(codes[f0 - 15 : f0 + 3], 15) - full).abs().max().item()
    assert kani_lookback > 1e-4  # 15 frames of lookback is audibly inexact


def test_batched_requests_equal_solo_decodes(codec):
    lengths = [37, 5, 64, 1]
    solo = [codec.decode(random_codes(n, seed=i)[None])[0] for i, n in enumerate(lengths)]
    batch = torch.zeros(len(lengths), max(lengths), 4, dtype=torch.int64)
    for i, n in enumerate(lengths):
        batch[i, :n] = random_codes(n, seed=i)
    audio = codec.decode(batch, torch.tensor(lengths))
    assert audio.shape == (4, 64 * SPF)
    for i, n in enumerate(lengths):
        assert_close(audio[i, : n * SPF], solo[i])
        assert not audio[i, n * SPF :].any()  # NeMo's zero tail


def test_batched_windows_equal_solo_windows(codec):
    windows = [random_codes(n, seed=10 + n) for n in (30, 41, 3, 29)]
    lefts = [28, 28, 0, 29]
    batched = codec.decode_windows(windows, lefts)
    for window, left, audio in zip(windows, lefts, batched, strict=True):
        assert audio.shape == ((window.shape[0] - left) * SPF,)
        assert_close(audio, codec.decode_window(window, left))


def test_long_windows_split_exactly(codec):
    codes = random_codes(75, seed=3)
    whole = codec.decode_window(codes, 0)
    split = codec.decode_windows([codes], [0], max_new_frames=20)[0]
    assert_close(split, whole)


@pytest.mark.parametrize("style", ["nemo", "folded", "legacy"])
def test_nemo_and_safetensors_load_identically(ckpt, codec, tmp_path, style):
    """``.nemo`` and ``config.json + model.safetensors`` give the same decoder (weight norm as NeMo's
    parametrization pair, already folded, or as legacy weight_g/weight_v)."""
    out = convert_nemo(ckpt / "codec" / "nanocodec.nemo", tmp_path / "codec")
    if style != "nemo":
        tensors = read_decoder_tensors(out)
        renamed = {}
        for name, t in tensors.items():
            if style == "legacy":
                name = name.replace("parametrizations.weight.original0", "weight_g")
                name = name.replace("parametrizations.weight.original1", "weight_v")
            elif name.endswith("original1"):
                g = tensors[name.replace("original1", "original0")]
                name, t = name.replace("parametrizations.weight.original1", "weight"), torch._weight_norm(t, g, 0)
            elif name.endswith("original0"):
                continue
            renamed[name] = t
        save_codec(out, NanoCodecConfig.from_nemo(json.loads((out / "config.json").read_text())), renamed)
    other = load_codec(out)
    codes = random_codes(12, batch=2, seed=5)
    assert torch.equal(other.decode(codes), codec.decode(codes))


def test_checkpoint_codec_found_automatically(ckpt, tmp_path):
    assert find_codec(ckpt) == ckpt / "codec" / "nanocodec.nemo"
    assert find_codec(ckpt / "codec") == ckpt / "codec" / "nanocodec.nemo"
    with pytest.raises(FileNotFoundError, match="no NanoCodec"):
        find_codec(tmp_path)


def _codec_dir_with(tmp_path, ckpt, **changes) -> str:
    out = convert_nemo(ckpt / "codec" / "nanocodec.nemo", tmp_path / "codec")
    config = json.loads((out / "config.json").read_text())
    for path, value in changes.items():
        node = config
        *parents, leaf = path.split("__")
        for p in parents:
            node = node[p]
        node[leaf] = value
    (out / "config.json").write_text(json.dumps(config))
    return out


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"sample_rate": 24000}, "codec sample_rate=24000 but Stage 0 (kani_tts.sample_rate) expects 22050"),
        (
            {"vector_quantizer__num_levels_per_group": [8, 8, 8, 8]},
            "codec codebook_size=4096 but Stage 0 (kani_tts.codebook_size) expects 4032",
        ),
        (
            {"vector_quantizer__num_groups": 8, "audio_decoder__input_dim": 32},
            "codec num_codebooks=8 but Stage 0 (kani_tts.num_codebooks) expects 4",
        ),
        (
            {"sample_rate": 44100, "samples_per_frame": 1764},
            "codec sample_rate=44100 but Stage 0",
        ),
    ],
)
def test_codec_disagreeing_with_stage0_is_a_clear_error(tmp_path, ckpt, changes, message):
    with pytest.raises(KaniConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_codec(_codec_dir_with(tmp_path, ckpt, **changes))


def test_frame_rate_is_checked_against_stage0_settings(ckpt):
    settings = KaniTTSSettings(variant="parallel", frame_rate=25.0)
    with pytest.raises(ValueError, match=r"codec frame_rate=12.5 but Stage 0 .* expects 25"):
        load_codec(ckpt, settings=settings)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"audio_decoder__activation": "snake"}, "activation='snake' is not supported"),
        ({"audio_decoder__base_channels": 64}, "has shape"),
        (
            {"audio_decoder__up_sample_rates": [7, 7, 6, 3, 4]},
            "samples_per_frame=1764 but up_sample_rates .* give 3528",
        ),
    ],
)
def test_unusable_codec_is_a_clear_error(tmp_path, ckpt, changes, message):
    with pytest.raises(CodecConfigError, match=message):
        load_codec(_codec_dir_with(tmp_path, ckpt, **changes))


def test_bad_windows_are_refused(codec):
    with pytest.raises(ValueError, match=r"codes must be in \[0, 4032\)"):
        codec.decode_window(torch.full((3, 4), DEFAULT_CONFIG.codebook_size), 0)
    with pytest.raises(ValueError, match=r"must be \[frames, 4\]"):
        codec.decode_window(torch.zeros(12, dtype=torch.int64), 0)
    with pytest.raises(ValueError, match="outside the 3-frame window"):
        codec.decode_window(torch.zeros(3, 4, dtype=torch.int64), 4)
    assert codec.decode_window(torch.zeros(3, 4, dtype=torch.int64), 3).numel() == 0


def snr_db(audio: torch.Tensor, reference: torch.Tensor) -> float:
    """Signal-to-noise ratio of ``audio`` against ``reference``, in dB."""
    noise = (audio.double() - reference.double()).pow(2).sum()
    return (10 * torch.log10(reference.double().pow(2).sum() / noise)).item()


def test_narrow_conv_precisions_keep_float32_activations(ckpt, codec, capsys):
    """bf16/fp16 convs with float32 in between: closer to strict float32 than an all-bf16 decode, reported as SNR
    (the GPU figures, and which mode ships, are in docs/BENCHMARKS.md).

    Both decodes round the convs' inputs, weights and outputs to bf16; the all-bf16 one also rounds every activation
    and residual sum, so it must be the further off. By how much depends on the CPU's bf16 conv kernels (an AVX2-only
    AMD EPYC: 37.2 against 34.2 dB), so the check is the order, not a margin."""
    codes = random_codes(30, batch=2, seed=7)
    reference = codec.decode(codes)
    bf16 = load_codec(ckpt, dtype=torch.bfloat16)
    assert bf16.precision == "bf16" and bf16.dtype == torch.float32
    assert bf16.pre_conv.weight.dtype == torch.bfloat16 and bf16.post_activation.alpha.dtype == torch.float32
    narrow = snr_db(bf16.decode(codes), reference)
    everything_bf16 = snr_db(load_codec(ckpt).to(torch.bfloat16).decode(codes).float(), reference)
    with capsys.disabled():
        print(
            "\nNanoCodec SNR vs strict fp32 (tiny codec, CPU): "
            f"bf16 convs {narrow:.1f} dB, all bf16 {everything_bf16:.1f} dB"
        )
    assert narrow > everything_bf16
    assert load_codec(ckpt, precision="tf32").precision == "tf32"  # CPUs ignore the TF32 switch
    with pytest.raises(ValueError, match="codec precision must be one of fp32, tf32, bf16, fp16"):
        codec.set_precision("int8")
    with pytest.raises(ValueError, match="needs float32 activations"):
        load_codec(ckpt, dtype=torch.float64, precision="bf16")
    with pytest.raises(ValueError, match="disagree"):
        load_codec(ckpt, dtype=torch.bfloat16, precision="fp16")


def test_config_round_trips_through_nemo_dict():
    for config in (DEFAULT_CONFIG, CODEC_PRESETS["tiny"]):
        assert NanoCodecConfig.from_nemo(config.to_nemo()) == config
    assert sum(p.numel() for p in load_params(DEFAULT_CONFIG)) == 31_465_805


def load_params(config):
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import NanoCodecDecoder

    with torch.device("meta"):
        return list(NanoCodecDecoder(config).parameters())


def test_factory_codec_is_deterministic(tmp_path, ckpt):
    from vllm_omni_kani.tools.codec_factory import write_nemo

    again = read_decoder_tensors(write_nemo(tmp_path / "again.nemo", "tiny", 0))
    original = read_decoder_tensors(ckpt / "codec" / "nanocodec.nemo")
    assert again.keys() == original.keys()
    assert all(torch.equal(again[k], original[k]) for k in again)


def test_decode_leaves_the_process_tf32_switch_alone(codec):
    """The decoder forces strict float32 convs only while it runs (TF32 on a GPU is ~5e-4 off NeMo)."""
    before = torch.backends.cudnn.allow_tf32
    try:
        for setting in (True, False):
            torch.backends.cudnn.allow_tf32 = setting
            codec.decode(random_codes(2, batch=1))
            assert torch.backends.cudnn.allow_tf32 is setting
    finally:
        torch.backends.cudnn.allow_tf32 = before


def test_incomplete_or_extra_weights_are_a_clear_error(ckpt, tmp_path):
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import NanoCodecDecoder, load_decoder_state

    tensors = read_decoder_tensors(ckpt)
    decoder = NanoCodecDecoder(CODEC_PRESETS["tiny"])
    gone = "audio_decoder.post_conv.conv.bias"
    with pytest.raises(CodecConfigError, match=r"1 missing \(e.g. \['post_conv.bias'\]\), 0 unexpected"):
        load_decoder_state(decoder, {k: v for k, v in tensors.items() if k != gone})
    with pytest.raises(CodecConfigError, match=r"0 missing .* 1 unexpected \(e.g. \['extra.bias'\]\)"):
        load_decoder_state(decoder, {**tensors, "audio_decoder.extra.conv.bias": torch.zeros(1)})
    half = "audio_decoder.pre_conv.conv.parametrizations.weight.original0"
    with pytest.raises(CodecConfigError, match=r"pre_conv\.weight: weight-norm direction without its magnitude"):
        load_decoder_state(decoder, {k: v for k, v in tensors.items() if k != half})
