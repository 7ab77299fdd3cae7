"""Stage 0 under vLLM-Omni's real engine (CPU): frames equal the transformers reference,
seeded sampling is reproducible and batch-independent, flattened streams group into frames,
and broken checkpoints fail at load with a message naming the problem."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import REPO_ROOT
from vllm_omni_kani.benchmarks.playback import Playback
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.modeling_hf import ParallelHeadLfm2ForCausalLM, generate_frames
from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import (
    FRAME_SECONDS,
    LEAD_KEY,
    ChunkPolicy,
    FrameStream,
    frames_from_parallel_output,
)

LM_ONLY_YAML = REPO_ROOT / "stage_configs" / "kani_tts_lm_cpu.yaml"
STEPS = 64
# Four prompts of different lengths, run as one batch.
PROMPTS = [tl.build_prompt([tl.START_OF_TEXT, *range(300, 300 + n)]) for n in (2, 9, 23, 57)]

pytestmark = pytest.mark.engine


def _omni(ckpt: Path):
    import vllm_omni_kani

    vllm_omni_kani.register()  # offline use: vLLM-Omni resolves the pipeline before it loads plugins
    from vllm_omni.entrypoints.omni import Omni

    return Omni(model=str(ckpt), deploy_config=str(LM_ONLY_YAML), dtype="float32", max_num_seqs=len(PROMPTS))


def _run(omni, prompts: list[list[int]], params) -> list:
    """Generate one batch (Stage 0's sampling params shared by all) and return outputs in prompt order."""
    results = omni.generate([{"prompt_token_ids": p} for p in prompts], [params])
    return sorted(results, key=lambda o: int(str(o.request_id).split("_")[0]))


def _frames(output) -> np.ndarray:
    packed = output.multimodal_output["codes"]["audio"]
    return frames_from_parallel_output(list(output.request_output.outputs[0].token_ids), np.asarray(packed))


@pytest.fixture(scope="module")
def parallel_omni(tiny_parallel):
    omni = _omni(tiny_parallel)
    yield omni
    omni.close()


def _params(**kw):
    from vllm import SamplingParams

    base = dict(max_tokens=STEPS, detokenize=False, stop_token_ids=[tl.END_OF_SPEECH])
    return SamplingParams(**{**base, **kw})


def test_greedy_frames_equal_hf_reference(parallel_omni, tiny_parallel):
    ref_model = ParallelHeadLfm2ForCausalLM.from_pretrained(tiny_parallel, dtype=torch.float32).eval()
    reference = [generate_frames(ref_model, p, STEPS).numpy() for p in PROMPTS]
    outs = _run(parallel_omni, PROMPTS, _params(temperature=0.0))
    for prompt, ref, out in zip(PROMPTS, reference, outs, strict=True):
        got = _frames(out)
        assert ref.shape == (STEPS, tl.NUM_CODEBOOKS), "pick prompts whose greedy run is >= 64 frames"
        np.testing.assert_array_equal(got, ref, err_msg=f"prompt of {len(prompt)} tokens")
        assert len(set(got[:, 1].tolist())) > 8  # the heads really produce varied codes


def test_step_time_codes_alone_decode_one_prompt_a_step_and_equal_the_hf_reference(
    parallel_omni, tiny_parallel, monkeypatch
):
    """``step_time --codes --codes-alone`` (the GPU suite's compile-agreement runs): each prompt goes to the engine on
    its own, so its steps have one row as a served e2e request's do, and its frames are the reference's."""
    from vllm_omni_kani.benchmarks import step_time

    monkeypatch.setattr(step_time, "CODES_PROMPTS", 3)
    sizes: list[int] = []

    def generate(prompts, params):
        sizes.append(len(prompts))
        return _run(parallel_omni, prompts, params)

    got = step_time.greedy_frames(generate, alone=True)
    assert sizes == [1, 1, 1]
    ref_model = ParallelHeadLfm2ForCausalLM.from_pretrained(tiny_parallel, dtype=torch.float32).eval()
    for prompt, frames in zip(step_time.prompts(3, offset=500), got, strict=True):
        want = generate_frames(ref_model, prompt, step_time.CODES_FRAMES).numpy()
        np.testing.assert_array_equal(np.asarray(frames).reshape(-1, tl.NUM_CODEBOOKS), want[: len(frames)])
        assert 0 < len(frames) <= len(want)


def test_seeded_sampling_is_reproducible_and_batch_independent(parallel_omni):
    """Every request owns a generator seeded from its params: same seed, same frames, whoever shares the batch (the
    codebook-1 and code-head noise both hashed from seed and step, the defaults)."""
    seeded = _params(temperature=0.9, top_k=200, top_p=0.95, seed=1234)
    alone_1 = _frames(_run(parallel_omni, PROMPTS[:1], seeded)[0])
    alone_2 = _frames(_run(parallel_omni, PROMPTS[:1], seeded)[0])
    batched = [_frames(o) for o in _run(parallel_omni, PROMPTS, seeded)]
    np.testing.assert_array_equal(alone_1, alone_2)
    np.testing.assert_array_equal(alone_1, batched[0])
    alone_last = _frames(_run(parallel_omni, PROMPTS[-1:], seeded)[0])
    np.testing.assert_array_equal(alone_last, batched[-1])
    greedy = _frames(_run(parallel_omni, PROMPTS[:1], _params(temperature=0.0))[0])
    assert not np.array_equal(alone_1, greedy[: len(alone_1)])  # sampling really sampled
    assert len(np.unique(alone_1[:, 1:])) > 30


def test_penalties_from_device_counts_give_the_same_frames(parallel_omni, tiny_parallel, monkeypatch, capfd):
    """The penalties read output tokens counted on the device (``penalty_counts``, on by default), and a batch
    under strong repetition, frequency and presence penalties decodes the frames vLLM's own path
    (``KANI_STAGE0_SAMPLER_PATCHES=0``) decodes."""
    penalised = _params(temperature=0.0, repetition_penalty=1.8, frequency_penalty=0.5, presence_penalty=0.3)
    got = [_frames(o) for o in _run(parallel_omni, PROMPTS, penalised)]
    plain = [_frames(o) for o in _run(parallel_omni, PROMPTS, _params(temperature=0.0))]
    assert any(not np.array_equal(g, p) for g, p in zip(got, plain, strict=True))  # the penalties bite
    monkeypatch.setenv("KANI_STAGE0_SAMPLER_PATCHES", "0")
    capfd.readouterr()
    omni = _omni(tiny_parallel)
    try:
        want = [_frames(o) for o in _run(omni, PROMPTS, penalised)]
    finally:
        omni.close()
    captured = capfd.readouterr()
    assert "penalties: output-token counts kept on the device" not in captured.out + captured.err
    for prompt, w, g in zip(PROMPTS, want, got, strict=True):
        np.testing.assert_array_equal(g, w, err_msg=f"prompt of {len(prompt)} tokens")


def test_a_top_k_wider_than_a_code_head_row_samples_the_unfiltered_codes(parallel_omni):
    """The code heads take each request's top-k; their rows are 4,032 codes wide. A top-k above that (5,000 here;
    vLLM's "no top-k", -1, is the whole 68,442-token vocabulary) samples what no top-k samples, where vLLM's torch
    top-k (under 8 head rows: one or two requests) indexed out of range and took the engine down."""
    seeded = dict(temperature=0.9, top_p=0.95, seed=99)
    wide = _frames(_run(parallel_omni, PROMPTS[:1], _params(top_k=5000, **seeded))[0])
    unfiltered = _frames(_run(parallel_omni, PROMPTS[:1], _params(top_k=-1, **seeded))[0])
    np.testing.assert_array_equal(wide, unfiltered)
    assert len(np.unique(wide[:, 1:])) > 8  # the heads really sampled


def test_codebook1_noise_is_hashed_by_default_and_vllms_draws_stay_batch_independent(
    parallel_omni, tiny_parallel, monkeypatch, capfd
):
    """By default seeded requests' codebook-1 noise is hashed from seed and step for the whole batch
    (``codebook1_noise``); with ``KANI_STAGE0_SAMPLER_PATCHES=penalty_counts`` vLLM draws it from each request's
    generator. Both keep a request's frames the same alone and batched; their frames differ for the same seed."""
    seeded = _params(temperature=0.9, top_k=200, top_p=0.95, seed=1234)
    hashed = [_frames(o) for o in _run(parallel_omni, PROMPTS, seeded)]
    monkeypatch.setenv("KANI_STAGE0_SAMPLER_PATCHES", "penalty_counts")
    capfd.readouterr()
    omni = _omni(tiny_parallel)
    try:
        drawn = [_frames(o) for o in _run(omni, PROMPTS, seeded)]
        alone_first = _frames(_run(omni, PROMPTS[:1], seeded)[0])
        alone_last = _frames(_run(omni, PROMPTS[-1:], seeded)[0])
    finally:
        omni.close()
    captured = capfd.readouterr()
    assert "penalties: output-token counts kept on the device" in captured.out + captured.err
    assert "seeded codebook-1 noise" not in captured.out + captured.err
    np.testing.assert_array_equal(alone_first, drawn[0])
    np.testing.assert_array_equal(alone_last, drawn[-1])
    assert all(len(np.unique(f[:, 0])) > 8 for f in hashed + drawn)  # codebook 1 really sampled
    assert not any(np.array_equal(h, d) for h, d in zip(hashed, drawn, strict=True))


def test_top_k_over_the_open_columns_samples_the_frames_of_the_whole_rows(tiny_parallel, monkeypatch, capfd):
    """By default top-k/top-p runs on the columns the speech mask can leave open (``top_k_open_columns``); with the
    patch left out vLLM filters whole rows. Seeded requests (noise hashed from seed and step either way) sample the
    same frames both ways."""
    seeded = _params(temperature=0.9, top_k=50, top_p=0.9, seed=4321)
    frames = {}
    for patches in ("codebook1_noise,top_k_open_columns", "codebook1_noise"):
        monkeypatch.setenv("KANI_STAGE0_SAMPLER_PATCHES", patches)
        capfd.readouterr()
        omni = _omni(tiny_parallel)
        try:
            frames[patches] = [_frames(o) for o in _run(omni, PROMPTS, seeded)]
        finally:
            omni.close()
        captured = capfd.readouterr()
        engaged = "top-k/top-p over the open columns: first call" in captured.out + captured.err
        assert engaged == ("top_k_open_columns" in patches)
    ours, vllms = frames.values()
    for prompt, want, got in zip(PROMPTS, vllms, ours, strict=True):
        np.testing.assert_array_equal(got, want, err_msg=f"prompt of {len(prompt)} tokens")
    assert all(len(np.unique(f[:, 0])) > 8 and len(np.unique(f[:, 1:])) > 30 for f in ours)  # really sampled


def test_flattened_tokens_group_into_frames(tiny_flattened):
    from vllm import SamplingParams

    omni = _omni(tiny_flattened)
    try:
        prompt = PROMPTS[1]
        greedy = omni.generate([{"prompt_token_ids": prompt}], [_params(temperature=0.0, max_tokens=4 * 12)])[0]
        tokens = list(greedy.request_output.outputs[0].token_ids)
        grouped = tl.frames_from_flat_tokens(tokens)
        # The grammar mask puts every code in its codebook slot.
        assert grouped.invalid == 0 and grouped.dropped_partial == 0
        assert grouped.frames.shape == (len(tokens) // 4, 4)
        np.testing.assert_array_equal(tl.flat_tokens_from_frames(grouped.frames), tokens[: 4 * len(grouped.frames)])

        # END_OF_SPEECH forced in mid-frame (after six codes): one whole frame, two codes dropped and reported.
        mid = SamplingParams(
            max_tokens=32,
            min_tokens=6,
            detokenize=False,
            temperature=0.0,
            stop_token_ids=[tl.END_OF_SPEECH],
            logit_bias={tl.END_OF_SPEECH: 100.0},
        )
        out = omni.generate([{"prompt_token_ids": prompt}], [mid])[0]
        tokens = list(out.request_output.outputs[0].token_ids)
        assert tokens[6] == tl.END_OF_SPEECH and len(tokens) == 7
        cut = tl.frames_from_flat_tokens(tokens)
        assert cut.ended and cut.frames.shape == (1, 4) and cut.dropped_partial == 2
    finally:
        omni.close()


def _broken_checkpoint(src: Path, dst: Path, edit) -> Path:
    subprocess.run(["cp", "-r", str(src), str(dst)], check=True)
    weights = load_file(dst / "model.safetensors")
    edit(weights)
    save_file(weights, dst / "model.safetensors", metadata={"format": "pt"})
    return dst


LOAD_SCRIPT = textwrap.dedent(
    """
    import sys
    from vllm import LLM
    if __name__ == "__main__":
        LLM(model=sys.argv[1], dtype="float32", max_model_len=128, max_num_seqs=1, enforce_eager=True,
            kv_cache_memory_bytes=32 << 20)
    """
)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda w: w.pop("cb3_head.weight"), "checkpoint has no cb3_head.weight"),
        (
            lambda w: w.__setitem__("cb4_head.weight", w["cb4_head.weight"][:100]),
            "cb4_head.weight has shape [100, 64], expected [4032, 64]",
        ),
    ],
    ids=["missing-head", "wrong-head-size"],
)
def test_broken_checkpoint_fails_at_load_naming_the_tensor(tiny_parallel, tmp_path, edit, message):
    ckpt = _broken_checkpoint(tiny_parallel, tmp_path / "broken", edit)
    run = subprocess.run(
        [sys.executable, "-c", LOAD_SCRIPT, str(ckpt)], capture_output=True, text=True, timeout=600, cwd=REPO_ROOT
    )
    assert run.returncode != 0
    log = run.stdout + run.stderr  # vLLM logs the worker exception to stdout
    assert message in log, log[-4000:]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"architectures": ["LlamaForCausalLM"]}, "is not a Kani TTS model"),
        ({"vocab_size": 65536}, "cannot hold the Kani audio codes"),
        ({"kani_tts": {"codebook_size": 1024}}, "codebook_size=1024 but the Kani layout fixes 4032"),
        ({"kani_tts": {"speakers": ["a"], "default_speaker": "b"}}, "default_speaker 'b' is not one of speakers"),
    ],
)
def test_wrong_config_is_rejected_with_an_actionable_message(tiny_parallel, change, message):
    from transformers import AutoConfig

    from vllm_omni_kani.model_executor.models.kani_tts.configuration import KaniConfigError, KaniTTSSettings

    cfg = AutoConfig.from_pretrained(tiny_parallel)
    for key, value in change.items():
        setattr(cfg, key, value)
    with pytest.raises(KaniConfigError, match=message):
        KaniTTSSettings.from_hf_config(cfg)


# -- codec chunking (pure Python: chunk rules on plain frame lists, no engine) --------------------


def test_chunk_sizes_default_to_no_ramp():
    for policy in (ChunkPolicy(), ChunkPolicy.from_extra({}), ChunkPolicy.from_extra({"max_codec_chunk_frames": 16})):
        assert [policy.chunk_size(k) for k in range(6)] == [3, 16, 16, 16, 16, 16]
        assert policy.ramp_sizes() == [16]
        assert policy.recurring_windows() == [3, 44]


def test_chunk_ramp_doubles_up_to_the_cap():
    policy = ChunkPolicy.from_extra(
        {"initial_codec_chunk_frames": 3, "codec_chunk_frames": 16, "max_codec_chunk_frames": 64}
    )
    assert [policy.chunk_size(k) for k in range(7)] == [3, 16, 32, 64, 64, 64, 64]
    assert policy.chunk_size(10_000) == 64
    assert policy.ramp_sizes() == [16, 32, 64]
    assert policy.recurring_windows() == [3, 44, 60, 92]
    # A cap that is not a power-of-two multiple is reached exactly.
    capped = ChunkPolicy(chunk_frames=16, max_chunk_frames=40)
    assert [capped.chunk_size(k) for k in range(1, 6)] == [16, 32, 40, 40, 40]
    assert capped.ramp_sizes() == [16, 32, 40]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            {"codec_chunk_frames": 16, "max_codec_chunk_frames": 8},
            "max_codec_chunk_frames=8 must be >= codec_chunk_frames=16",
        ),
        ({"codec_chunk_frames": 0}, "codec_chunk_frames=0"),
    ],
)
def test_chunk_policy_rejects_bad_knobs_naming_them(extra, message):
    with pytest.raises(ValueError, match=message):
        ChunkPolicy.from_extra(extra)


@pytest.mark.parametrize("max_chunk", [None, 16, 40, 64])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_chunk_stream_covers_every_frame_once_with_bounded_context(max_chunk, seed):
    """Frames arrive a few per producer call; the chunks' new frames are all frames, in order, each once,
    every window's left context is the frames just before it (at most 28), and only the last is final."""
    rng = np.random.default_rng(seed)
    total = int(rng.integers(150, 400))
    codes = rng.integers(0, tl.CODEBOOK_SIZE, size=(total, tl.NUM_CODEBOOKS))
    frames = [tl.pack_frame(row) for row in codes.tolist()]
    policy = ChunkPolicy(max_chunk_frames=max_chunk)
    stream = FrameStream("parallel")
    chunks = []
    while len(stream.frames) < total:
        stream.frames.extend(frames[len(stream.frames) : len(stream.frames) + int(rng.integers(1, 8))])
        finished = len(stream.frames) == total
        chunk = stream.next_chunk(policy, finished)
        if chunk is not None:
            chunks.append(chunk)
    new = np.concatenate([c.window[c.left_context :] for c in chunks])
    np.testing.assert_array_equal(new, codes)
    sent = 0
    for k, chunk in enumerate(chunks):
        assert chunk.left_context == min(policy.left_context_frames, sent) <= 28
        np.testing.assert_array_equal(chunk.window[: chunk.left_context], codes[sent - chunk.left_context : sent])
        if not chunk.finished:  # a non-final chunk sends whole multiples of its ramp size
            assert chunk.new_frames % policy.chunk_size(k) == 0
        sent += chunk.new_frames
    assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
    # Frames arriving one at a time: every non-final window is one of the recurring sizes once context is full.
    step_stream, windows = FrameStream("parallel"), []
    for i in range(total):
        step_stream.frames.append(frames[i])
        chunk = step_stream.next_chunk(policy, i == total - 1)
        if chunk is not None and not chunk.finished and chunk.left_context == policy.left_context_frames:
            windows.append(len(chunk.window))
    assert windows and set(windows) <= set(policy.recurring_windows())


# The chunk sizes of kani_tts.yaml: 3, then 8 doubling to 64.
GPU_CHUNKS = {"initial_codec_chunk_frames": 3, "codec_chunk_frames": 8, "max_codec_chunk_frames": 64}


def _paced_run(policy: ChunkPolicy, step_s: float, delivery_s: float, total: int = 250) -> tuple[list, Playback]:
    """One stream whose Stage 0 makes a frame every ``step_s`` (the producer called after each), each chunk heard
    ``delivery_s`` after it goes out: its chunks and the listener's playback."""
    rng = np.random.default_rng(7)
    frames = [tl.pack_frame(row) for row in rng.integers(0, tl.CODEBOOK_SIZE, (total, tl.NUM_CODEBOOKS)).tolist()]
    stream, chunks, player = FrameStream("parallel"), [], Playback()
    for i, frame in enumerate(frames):
        now = (i + 1) * step_s
        stream.frames.append(frame)
        chunk = stream.next_chunk(policy, i == total - 1, now)
        if chunk is not None:
            chunks.append(chunk)
            player.arrive(now + delivery_s, chunk.new_frames * FRAME_SECONDS)
    new = np.concatenate([c.window[c.left_context :] for c in chunks])
    np.testing.assert_array_equal(new, tl.unpack_frames(frames))  # every frame once, in order
    return chunks, player


def test_the_chunk_lead_knob_is_milliseconds_and_refuses_nonsense():
    assert ChunkPolicy.from_extra({}).lead_s is None
    assert ChunkPolicy.from_extra({LEAD_KEY: 120}).lead_s == pytest.approx(0.12)
    assert ChunkPolicy.from_extra({LEAD_KEY: 0}).lead_s == 0.0
    for bad in ("120", True, [1], -5, float("nan")):
        with pytest.raises(ValueError, match=LEAD_KEY):
            ChunkPolicy.from_extra({LEAD_KEY: bad})


def test_paced_chunks_keep_a_slow_stream_ahead_of_its_listener():
    """The shipped sizes (3, then 8 doubling to 64) with Stage 0 stepping every 34 ms (a loaded H200 with long
    requests): the 8-frame second chunk takes 272 ms, longer than the first chunk's 240 ms of audio, so the listener
    stalls. With a 100-ms lead the second chunk goes out with what it has before the first has played, the stream
    stays ahead to its end, and it costs at most two chunks more."""
    fixed, fixed_player = _paced_run(ChunkPolicy.from_extra(GPU_CHUNKS), step_s=0.034, delivery_s=0.05)
    assert fixed_player.stalls >= 1 and fixed_player.first_stall_at_s == pytest.approx(3 * FRAME_SECONDS)
    assert not any(c.paced for c in fixed)

    paced, player = _paced_run(ChunkPolicy.from_extra({**GPU_CHUNKS, LEAD_KEY: 100}), step_s=0.034, delivery_s=0.05)
    assert player.stall_s == 0
    assert paced[0].new_frames == 3 and not paced[0].paced
    assert paced[1].paced and paced[1].new_frames < 8
    assert len(paced) <= len(fixed) + 2
    assert [c.finished for c in paced] == [False] * (len(paced) - 1) + [True]


def test_paced_chunks_leave_a_fast_stream_as_it_was():
    """Stage 0 stepping every 12 ms: every chunk reaches its size well before the listener needs it, so the lead
    never fires and the chunks are the fixed schedule's, frame for frame."""
    fixed, _ = _paced_run(ChunkPolicy.from_extra(GPU_CHUNKS), step_s=0.012, delivery_s=0.05)
    paced, player = _paced_run(ChunkPolicy.from_extra({**GPU_CHUNKS, LEAD_KEY: 100}), step_s=0.012, delivery_s=0.05)
    assert [c.new_frames for c in paced] == [c.new_frames for c in fixed] == [3, 8, 16, 32, 64, 64, 63]
    assert not any(c.paced for c in paced) and player.stall_s == 0


def test_a_paced_chunk_needs_half_its_size():
    """Behind its listener, a stream sends a paced chunk only once half the chunk's size is pending (a stream Stage 0
    makes slower than it plays would otherwise go out a frame a chunk); without a clock, or before its first chunk,
    the lead does not apply."""
    policy = ChunkPolicy(initial_chunk_frames=3, chunk_frames=8, lead_s=0.1)
    frame = tl.pack_frame([1, 2, 3, 4])
    stream = FrameStream("parallel", frames=[frame] * 3)
    assert not stream.behind(policy, now=100.0)  # no first chunk yet
    assert stream.next_chunk(policy, False, now=0.0).new_frames == 3
    assert stream.behind(policy, now=0.15) and stream.next_chunk(policy, False, now=0.15) is None
    stream.frames += [frame] * 3
    assert stream.next_chunk(policy, False, now=0.15) is None  # 3 of 8: under half
    stream.frames.append(frame)
    assert stream.next_chunk(policy, False) is None  # no clock: only the sizes decide
    chunk = stream.next_chunk(policy, False, now=0.15)
    assert chunk.paced and chunk.new_frames == 4 and chunk.index == 1


def test_paced_chunks_stay_few_when_stage0_is_slower_than_the_audio():
    """Stage 0 stepping every 100 ms (slower than a frame plays): the listener stalls either way, and paced chunks,
    at least half their size each, stay within a few of the fixed schedule's count instead of one frame each."""
    fixed, fixed_player = _paced_run(ChunkPolicy.from_extra(GPU_CHUNKS), step_s=0.1, delivery_s=0.05)
    paced, player = _paced_run(ChunkPolicy.from_extra({**GPU_CHUNKS, LEAD_KEY: 100}), step_s=0.1, delivery_s=0.05)
    assert fixed_player.stall_s > 0 and player.stall_s > 0
    assert len(paced) <= len(fixed) + 5
    assert all(c.new_frames * 2 >= GPU_CHUNKS["codec_chunk_frames"] for c in paced[1:-1])


def test_frame_stream_pairs_live_tokens_with_step_codes():
    """The producer hands FrameStream the request's live (growing) token list and each step's packed codes; a
    frame is formed only once both its cb1 token and its codes have arrived, each frame once, in order."""
    rng = np.random.default_rng(3)
    frames = rng.integers(0, tl.CODEBOOK_SIZE, size=(40, tl.NUM_CODEBOOKS))
    packed = tl.pack_codes(torch.from_numpy(frames[:, 1:])).tolist()
    stream = FrameStream("parallel")
    stream.add_step_codes([tl.NO_CODES])  # a step whose token vLLM did not keep
    # The prefill step: its payload has an entry per prompt token, only the last one belongs to the sampled token
    # (START_OF_SPEECH, which is not audio: its codes make no frame).
    tokens: list[int] = [tl.START_OF_SPEECH]
    stream.add_step_codes([tl.NO_CODES, tl.NO_CODES, 0])
    stream.add_tokens(tokens)
    assert stream.frames == []
    for k, row in enumerate(frames):
        tokens.append(tl.AUDIO_TOKEN_OFFSET + int(row[0]))
        tokens.append(tl.END_OF_SPEECH)  # the engine may run a step ahead of the save thread ...
        stream.add_tokens(tokens)
        tokens.pop()  # ... (a token without codes yet is not paired)
        assert len(stream.frames) == k
        stream.add_step_codes([packed[k]])
        stream.add_tokens(tokens)
        assert len(stream.frames) == k + 1
    np.testing.assert_array_equal(tl.unpack_frames(stream.frames), frames)
