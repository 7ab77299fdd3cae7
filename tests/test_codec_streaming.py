"""Stateful streaming codec: chunks decode only their new frames and still equal one decode of everything.

Runs on the factory's tiny codec (real rates, kernels and dilations). The stage tests build Stage 1 the way
the generation runner does (real VllmConfig, ``load_weights``, ``forward`` with payloads and request ids).
"""

from __future__ import annotations

import logging
import random

import numpy as np
import pytest
import torch

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.codec_streams import CodecStreams, StreamChunk
from vllm_omni_kani.model_executor.models.kani_tts.configuration import SAMPLES_PER_FRAME
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec import load_codec
from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.streaming import SlotsExhaustedError, StreamingCodec
from vllm_omni_kani.model_executor.models.kani_tts.token_layout import CODEBOOK_SIZE
from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import ChunkPolicy, FrameStream

SPF = SAMPLES_PER_FRAME
# float32 streamed vs one-shot on the same device: the two differ only in conv blocking (~1e-6 measured).
STREAM_ATOL = 1e-5
PCM16 = 32767


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def ckpt(make_ckpt):
    return make_ckpt("parallel")


@pytest.fixture(scope="module")
def flat_ckpt(make_ckpt):
    # A stock Lfm2ForCausalLM config, so vLLM's ModelConfig validates it without the plugin's registration.
    return make_ckpt("flattened")


@pytest.fixture(scope="module")
def decoder(ckpt):
    return load_codec(ckpt)


def codes(frames: int, seed: int) -> torch.Tensor:
    return torch.randint(0, CODEBOOK_SIZE, (frames, 4), generator=torch.Generator().manual_seed(seed))


def pcm16(audio: torch.Tensor) -> np.ndarray:
    return np.clip(np.round(audio.numpy() * PCM16), -PCM16 - 1, PCM16).astype(np.int32)


def stream_all(streams: CodecStreams, utterances: dict[str, torch.Tensor], sizes, seed: int) -> dict[str, torch.Tensor]:
    """Feed every utterance chunk by chunk, streams interleaved at random, several per step."""
    rng = random.Random(seed)
    sent = dict.fromkeys(utterances, 0)
    seq = dict.fromkeys(utterances, 0)
    pieces: dict[str, list[torch.Tensor]] = {r: [] for r in utterances}
    while any(sent[r] < len(u) for r, u in utterances.items()):
        step = []
        for rid, utt in utterances.items():
            if sent[rid] < len(utt) and rng.random() < 0.7:
                end = min(len(utt), sent[rid] + rng.choice(sizes))
                step.append(StreamChunk(rid, utt[sent[rid] : end], seq[rid], end == len(utt)))
                sent[rid], seq[rid] = end, seq[rid] + 1
        for chunk, audio in zip(step, streams.decode(step), strict=True):
            assert audio is not None and audio.shape == (chunk.frames.shape[0] * SPF,)
            pieces[chunk.request_id].append(audio)
    return {r: torch.cat(p) for r, p in pieces.items()}


@pytest.mark.parametrize(
    ("sizes", "seed"),
    [((1,), 0), ((1, 2, 3), 1), ((3, 16, 32), 2), ((1, 5, 16, 64, 70), 3)],
    ids=["1-frame", "1-3", "3-16-32", "mixed-with-split"],
)
def test_streamed_chunks_equal_one_shot_decode(decoder, sizes, seed):
    utterances = {f"req-{i}": codes(n, seed * 10 + i) for i, n in enumerate((41, 7, 90, 1))}
    streams = CodecStreams(StreamingCodec(decoder, num_slots=8), max_piece_frames=24)
    streamed = stream_all(streams, utterances, sizes, seed)
    for rid, utt in utterances.items():
        full = decoder.decode(utt[None])[0]
        torch.testing.assert_close(streamed[rid], full, atol=STREAM_ATOL, rtol=0)
        assert np.abs(pcm16(streamed[rid]) - pcm16(full)).max() <= 1  # PCM16: at most one LSB
    assert streams.live == 0  # every stream's last chunk freed its slot


@pytest.mark.parametrize(
    ("below", "layers"), [(20, [2, 3, 4]), (128, [0, 1, 2, 3, 4])], ids=["narrow-layers", "every-layer"]
)
@pytest.mark.parametrize(("sizes", "seed"), [((1,), 4), ((1, 5, 16, 64, 70), 5)], ids=["1-frame", "mixed-with-split"])
def test_channels_last_layers_stream_equal_one_shot_decode(decoder, below, layers, sizes, seed):
    """The CUDA default (narrow residual layers channels-last, channels zero-padded) forced on the CPU: the tiny
    codec's layers have 48, 24, 12, 6 and 3 channels, so 20 converts three of them and 128 all five."""
    codec = StreamingCodec(decoder, num_slots=8, channels_last_below=below)
    assert sorted(codec.channels_last_layers) == layers
    utterances = {f"req-{i}": codes(n, seed * 10 + i) for i, n in enumerate((41, 7, 90, 1))}
    streamed = stream_all(CodecStreams(codec, max_piece_frames=24), utterances, sizes, seed)
    for rid, utt in utterances.items():
        full = decoder.decode(utt[None])[0]
        torch.testing.assert_close(streamed[rid], full, atol=STREAM_ATOL, rtol=0)
        assert np.abs(pcm16(streamed[rid]) - pcm16(full)).max() <= 1
    # The padded channels' states stay exactly zero: nothing leaks into them.
    for state, layer in zip(codec.pool, codec.layers, strict=True):
        if id(layer) in codec._padded:
            assert not state[..., layer.weight.shape[1] :].any()


def test_a_step_names_its_sections_in_order(decoder):
    """``on_section`` (benchmarks/codec_layers.py times the step with it) hears every section once, in order."""
    codec = StreamingCodec(decoder, num_slots=2, scratch_rows=1, channels_last_below=20)
    names: list[str] = []
    utt = codes(4, 3)[None]
    with torch.inference_mode():
        codec.step(utt, torch.tensor([4]), torch.tensor([0]), on_section=names.append)
    assert names[0] == "pre_conv" and names[-1] == "post_conv" and len(names) == 12
    assert names[1:3] == ["upsample 0 (x7, 48 ch)", "residual layer 0 (48 ch, 7 samples/frame)"]
    assert names[-2] == "residual layer 4 (3 ch, 1764 samples/frame)"


def test_stream_in_float64_equals_one_shot_to_rounding(ckpt):
    decoder = load_codec(ckpt, dtype=torch.float64)
    utt = codes(50, 7)
    streams = CodecStreams(StreamingCodec(decoder, num_slots=2), max_piece_frames=64)
    streamed = stream_all(streams, {"a": utt}, (1, 4, 9), seed=5)["a"]
    torch.testing.assert_close(
        streamed, decoder.decode(utt[None])[0], atol=1000 * torch.finfo(torch.float64).eps, rtol=0
    )


@pytest.mark.parametrize("below", [0, 20])
def test_state_holds_exactly_each_layers_causal_context(decoder, below):
    codec = StreamingCodec(decoder, num_slots=3, scratch_rows=2, channels_last_below=below)
    assert len(codec.pool) == len(codec.layers) == 97  # pre/post conv, 5 upsamplers, 5 × 3 × 3 × 2 residual convs
    channels_last = 0
    for state, layer in zip(codec.pool, codec.layers, strict=True):
        if id(layer) in codec._padded:  # [rows, context, channels padded to a multiple of 8]
            channels_last += 1
            width = layer.weight.shape[1]
            assert state.shape == (5, codec.context(layer), -(-width // 8) * 8)
        else:
            assert state.shape[0] == 5 and state.shape[-1] == codec.context(layer) > 0
    assert channels_last == (3 * 18 if below else 0)  # three layers of 18 convs each
    assert codec.state_bytes_per_slot == sum(s[0].numel() * 4 for s in codec.pool)


def test_out_of_order_and_unknown_streams_are_refused_loudly(decoder, caplog):
    streams = CodecStreams(StreamingCodec(decoder, num_slots=4), max_piece_frames=16)
    utt = codes(6, 11)
    with caplog.at_level(logging.ERROR):
        out = streams.decode([StreamChunk("late", utt[:2], 1, False), StreamChunk("ok", utt[:2], 0, False)])
        assert out[0] is None and out[1] is not None
        assert "request late starts at chunk 1, not 0" in caplog.text
        out = streams.decode([StreamChunk("ok", utt[2:4], 2, False)])  # chunk 1 never came
        assert out == [None]
        assert "request ok sent chunk 2 where 1 was due" in caplog.text
    assert streams.live == 0  # the broken stream gave its slot back


def test_slots_run_out_with_a_clear_error_and_come_back(decoder, caplog):
    streams = CodecStreams(StreamingCodec(decoder, num_slots=2), max_piece_frames=16)
    utt = codes(2, 12)
    with caplog.at_level(logging.ERROR):
        out = streams.decode([StreamChunk(r, utt, 0, False) for r in ("a", "b", "c")])
    assert [o is None for o in out] == [False, False, True]
    assert "all 2 codec state slots hold live streams" in caplog.text
    with pytest.raises(SlotsExhaustedError):
        streams.codec.acquire("d")
    streams.release(["a"])
    assert streams.decode([StreamChunk("c", utt, 0, True)])[0] is not None
    assert streams.live == 1


def test_a_reused_slot_starts_from_silence(decoder):
    """A slot freed mid-stream (abort) is zeroed before its next stream: that stream equals its solo decode."""
    streams = CodecStreams(StreamingCodec(decoder, num_slots=1), max_piece_frames=16)
    streams.decode([StreamChunk("aborted", codes(9, 13), 0, False)])
    streams.release(["aborted"])
    fresh = codes(9, 14)
    audio = streams.decode([StreamChunk("fresh", fresh, 0, True)])[0]
    torch.testing.assert_close(audio, decoder.decode(fresh[None])[0], atol=STREAM_ATOL, rtol=0)


def test_new_streams_joining_together_start_from_silence_in_one_zeroing_pass(decoder):
    """Slots are zeroed once per step for every stream that joined since the last one, not per stream: with
    every state slot holding garbage, three streams that join in one step beside a live one (and one more in the
    next step) each still equal their solo decode, and the live stream's state is left alone."""
    codec = StreamingCodec(decoder, num_slots=6)
    streams = CodecStreams(codec, max_piece_frames=16)
    for state in codec.pool:
        state.fill_(0.5)
    live = codes(12, 20)
    streams.decode([StreamChunk("live", live[:5], 0, False)])
    assert not codec._unzeroed  # the step zeroed its slot before reading it
    joining = {f"new{i}": codes(7, 21 + i) for i in range(3)}
    for rid in joining:
        codec.acquire(rid)
    assert sorted(codec._unzeroed) == sorted(codec.slot_of[r] for r in joining)
    streams.next_seq.update(dict.fromkeys(joining, 0))
    out = streams.decode(
        [StreamChunk("live", live[5:], 1, True), *(StreamChunk(r, u, 0, True) for r, u in joining.items())]
    )
    later = codes(4, 30)
    out.append(streams.decode([StreamChunk("later", later, 0, True)])[0])
    expected = [decoder.decode(live[None])[0][5 * SPF :], *(decoder.decode(u[None])[0] for u in joining.values())]
    expected.append(decoder.decode(later[None])[0])
    for audio, want in zip(out, expected, strict=True):
        torch.testing.assert_close(audio, want, atol=STREAM_ATOL, rtol=0)


def test_stateful_policy_sends_numbered_chunks_without_context():
    policy = ChunkPolicy.from_extra({"codec_stateful_decode": True, "max_codec_chunk_frames": 32})
    assert policy.window_context_frames == 0 and policy.recurring_windows() == [3, 16, 32]
    stream = FrameStream("parallel")
    chunks = []
    for have, finished in ((3, False), (19, False), (51, False), (60, True)):
        stream.frames = [tl.pack_frame([i, 0, 0, 0]) for i in range(have)]
        chunks.append(stream.next_chunk(policy, finished=finished))
    assert [(c.index, c.left_context, c.new_frames, c.finished) for c in chunks] == [
        (0, 0, 3, False),
        (1, 0, 16, False),
        (2, 0, 32, False),
        (3, 0, 9, True),
    ]
    assert [int(c.window[0, 0]) for c in chunks] == [0, 3, 19, 51]
    with pytest.raises(ValueError, match="codec_stateful_decode must be true or false"):
        ChunkPolicy.from_extra({"codec_stateful_decode": "yes"})


# --- Stage 1 as the generation runner drives it ----------------------------------------------------------------


def stateful_stage(ckpt, slots: int, **additional):
    from vllm.config import DeviceConfig, ModelConfig, VllmConfig

    from vllm_omni_kani.model_executor.models.kani_tts.codec_stage import KaniNanoCodecForGeneration

    model_config = ModelConfig(model=str(ckpt), dtype="float32", max_model_len=256, enforce_eager=True)
    model_config.stage_connector_config = {"extra": {"codec_stateful_decode": True}}
    config = VllmConfig(model_config=model_config, device_config=DeviceConfig("cpu"))
    config.additional_config = {"codec_state_slots": slots, **additional}
    stage = KaniNanoCodecForGeneration(vllm_config=config)
    stage.load_weights(iter(()))
    return stage


def chunk_payload(window: torch.Tensor, seq: int, finished: bool) -> dict:
    return {
        "codes": {"audio": window},
        "meta": {"left_context_size": 0, "stream_finished": torch.tensor(finished), "chunk_seq": seq},
    }


def run(stage, request_ids: list[str], infos: list[dict]) -> list[torch.Tensor]:
    with torch.inference_mode():
        out = stage(
            input_ids=torch.zeros(len(infos), dtype=torch.int64),
            positions=torch.zeros(len(infos), dtype=torch.int64),
            runtime_additional_information=infos,
            seq_token_counts=[1] * len(infos),
            request_ids=request_ids,
        )
    return out.multimodal_outputs["model_outputs"]


@pytest.mark.parametrize("channels_last_below", [None, 20], ids=["device-default", "narrow-layers-channels-last"])
def test_stage_streams_equal_one_decode_and_whole_windows_stay_stateless(flat_ckpt, channels_last_below):
    extra = {} if channels_last_below is None else {"codec_channels_last_below": channels_last_below}
    stage = stateful_stage(flat_ckpt, slots=4, **extra)
    assert sorted(stage.streams.codec.channels_last_layers) == ([] if channels_last_below is None else [2, 3, 4])
    decoder = load_codec(flat_ckpt)
    assert stage.requires_request_ids and stage.streams is not None
    utt = codes(40, 21)
    pieces = []
    for seq, (start, stop) in enumerate([(0, 3), (3, 19), (19, 40)]):
        infos = [chunk_payload(utt[start:stop], seq, stop == 40), {}]  # a second request scheduled without a chunk
        wavs = run(stage, ["r1", "idle"], infos)
        assert wavs[1].numel() == 0
        pieces.append(wavs[0])
    torch.testing.assert_close(torch.cat(pieces), decoder.decode(utt[None])[0], atol=STREAM_ATOL, rtol=0)
    assert stage.streams.live == 0
    # async_chunk off: the whole utterance comes with no chunk_seq and decodes as one window, holding no slot.
    whole = {"codes": {"audio": utt}, "meta": {"left_context_size": 0, "stream_finished": True}}
    torch.testing.assert_close(run(stage, ["r2"], [whole])[0], decoder.decode(utt[None])[0], atol=1e-4, rtol=0)
    assert stage.streams.live == 0


def test_stage_passes_the_next_half_snake_switch_to_its_codec(flat_ckpt):
    """``codec_fused_next_activation`` (default on) reaches the stateful codec; it only acts with the CUDA kernels, so
    on the CPU both settings stream the same audio."""
    utt = codes(20, 23)
    audio = {}
    for switch in (None, False):
        extra = {} if switch is None else {"codec_fused_next_activation": switch}
        stage = stateful_stage(flat_ckpt, slots=2, **extra)
        assert stage.streams.codec.fuse_next_activation is (switch is None)
        assert not stage.streams.codec.between_fused
        audio[switch] = run(stage, ["r"], [chunk_payload(utt, 0, True)])[0]
    assert torch.equal(audio[None], audio[False])


def test_stage_refuses_an_unknown_replay_plan_at_load(flat_ckpt):
    with pytest.raises(ValueError, match="codec_replay_plan must be one of cheapest, round_up; got 'fastest'"):
        stateful_stage(flat_ckpt, slots=4, codec_replay_plan="fastest")


def test_stage_frees_state_on_finish_and_abort_over_10000_requests(flat_ckpt):
    """10,000 one- and two-chunk streams, half ending with their last chunk, half aborted mid-stream
    (vLLM reports them through ``on_requests_finished``): no slot, no state tensor and no bookkeeping grows."""
    stage = stateful_stage(flat_ckpt, slots=512)
    streams = stage.streams
    pool_ptrs = [p.data_ptr() for p in streams.codec.pool]
    one = codes(1, 22)
    batch, total, done = 250, 10_000, 0
    while done < total:
        ids = [f"req-{done + i}" for i in range(batch)]
        run(stage, ids, [chunk_payload(one, 0, finished=(i % 2 == 0)) for i in range(batch)])
        assert streams.live == batch // 2  # the finished half freed its slots with the last chunk
        stage.on_requests_finished(ids)  # vLLM's finished set: the aborted half, and repeats of the others
        assert streams.live == 0
        done += batch
    assert len(streams.codec.slot_of) == len(streams.next_seq) == 0
    assert sorted(streams.codec._free) == list(range(512))
    assert [p.data_ptr() for p in streams.codec.pool] == pool_ptrs


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the CUDA default layout needs a CUDA device (CPU CI has none)"
)
def test_cuda_default_channels_last_stream_equals_one_shot(ckpt):
    decoder = load_codec(ckpt, device="cuda")  # strict float32
    codec = StreamingCodec(decoder, num_slots=4)
    assert sorted(codec.channels_last_layers) == [0, 1, 2, 3, 4]  # the tiny codec's layers are all narrower than 128
    utterances = {f"req-{i}": codes(n, 40 + i) for i, n in enumerate((41, 7, 90))}
    streamed = stream_all(CodecStreams(codec, max_piece_frames=24), utterances, (1, 3, 16, 64), seed=6)
    for rid, utt in utterances.items():
        full = decoder.decode(utt[None].cuda())[0]
        torch.testing.assert_close(streamed[rid], full, atol=STREAM_ATOL, rtol=0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device (CPU CI has none)")
def test_streaming_graphs_equal_eager(ckpt):
    from vllm_omni_kani.model_executor.models.kani_tts.nanocodec.graphs import StreamingGraphs

    decoder = load_codec(ckpt, device="cuda")
    eager = CodecStreams(StreamingCodec(decoder, num_slots=8, scratch_rows=4), max_piece_frames=16)
    graphed_codec = StreamingCodec(decoder, num_slots=8, scratch_rows=4)
    graphs = StreamingGraphs(graphed_codec, batch_buckets=(1, 2, 4), frame_buckets=(1, 3, 8, 16))
    assert graphs.capture() == 12
    # Every bucket's replay was timed after capture, for the cheapest replay plan.
    assert set(graphs.replay_ms) == set(graphs.graphs) and min(graphs.replay_ms.values()) > 0
    graphed = CodecStreams(graphed_codec, max_piece_frames=16, graphs=graphs)
    utterances = {f"r{i}": codes(n, 30 + i).cuda() for i, n in enumerate((37, 5, 20, 16, 9))}
    a = stream_all(eager, {k: v.cpu() for k, v in utterances.items()}, (1, 3, 16, 20), seed=9)
    b = stream_all(graphed, {k: v.cpu() for k, v in utterances.items()}, (1, 3, 16, 20), seed=9)
    assert graphs.replays > 0
    for rid in utterances:
        torch.testing.assert_close(b[rid], a[rid], atol=STREAM_ATOL, rtol=0)


@pytest.mark.engine
def test_paced_chunks_speak_as_the_fixed_schedule(tiny_parallel, tmp_path):
    """The offline CPU pipeline with a lead far above any utterance (``codec_chunk_lead_ms``: every later chunk is
    due at once, so each producer call sends what it has): its chunks go out paced (the trace says so) and every
    utterance equals the one spoken with the fixed sizes, within one PCM16 step (other chunkings, same audio)."""
    from tests.conftest import REPO_ROOT, speak_offline
    from vllm_omni_kani.benchmarks.variants import derive
    from vllm_omni_kani.model_executor.stage_input_processors.kani_chunks import LEAD_KEY

    base = REPO_ROOT / "stage_configs/kani_tts_cpu.yaml"
    paced = derive(base, tmp_path / "paced.yaml", [f"connectors.shm.extra.{LEAD_KEY}=600000"])
    texts = ["Hello there.", "A second one, a little longer."]
    log, spoken = speak_offline(
        tiny_parallel, paced, texts, tmp_path / "paced", max_new_tokens=40, env={"KANI_TRACE_CHUNKS": "1"}
    )
    emitted = [line for line in log.splitlines() if "stage0 emit" in line]
    assert sum("paced=True" in line for line in emitted) >= len(texts), log[-3000:]
    _, reference = speak_offline(tiny_parallel, base, texts, tmp_path / "base", max_new_tokens=40)
    for a, b in zip(spoken, reference, strict=True):
        assert a.shape == b.shape and a.any()
        assert np.abs(a.astype(np.int32) - b).max() <= 1
