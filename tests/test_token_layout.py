"""The Kani token layout: prompt shape, id arithmetic and flattened frame grouping."""

import numpy as np

from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl


def test_layout_constants_match_kani():
    assert (tl.START_OF_SPEECH, tl.END_OF_SPEECH) == (64401, 64402)
    assert (tl.START_OF_HUMAN, tl.END_OF_HUMAN, tl.START_OF_AI, tl.END_OF_AI, tl.PAD) == (
        64403,
        64404,
        64405,
        64406,
        64407,
    )
    assert tl.AUDIO_TOKEN_OFFSET == 64410
    assert tl.PARALLEL_VOCAB_SIZE == 68442
    assert tl.FLATTENED_VOCAB_SIZE == 80539


def test_prompt_wraps_text_and_prefills_speech_start():
    ids = tl.build_prompt([1, 100, 200])
    assert ids == [
        tl.START_OF_HUMAN,
        1,
        100,
        200,
        tl.END_OF_TEXT,
        tl.END_OF_HUMAN,
        tl.START_OF_AI,
        tl.START_OF_SPEECH,
    ]
    assert tl.build_prompt([1, 5], prefill_speech_start=False)[-1] == tl.END_OF_HUMAN
    assert tl.speaker_text("hi", "andrew") == "andrew: hi"
    assert tl.speaker_text("hi", None) == "hi"


def test_flat_round_trip():
    rng = np.random.default_rng(0)
    frames = rng.integers(0, tl.CODEBOOK_SIZE, size=(7, tl.NUM_CODEBOOKS))
    tokens = tl.flat_tokens_from_frames(frames)
    assert tokens[0] == 64410 + frames[0, 0]
    assert tokens[1] == 64410 + 4032 + frames[0, 1]
    stream = [tl.START_OF_AI, tl.START_OF_SPEECH, *tokens.tolist(), tl.END_OF_SPEECH]
    got = tl.frames_from_flat_tokens(stream)
    np.testing.assert_array_equal(got.frames, frames)
    assert got.ended and got.dropped_partial == 0 and got.invalid == 0


def test_end_of_speech_mid_frame_drops_and_reports_partial_frame():
    frames = np.array([[1, 2, 3, 4], [5, 6, 7, 8]])
    tokens = tl.flat_tokens_from_frames(frames).tolist()
    stream = [tl.START_OF_SPEECH, *tokens, *tokens[:2], tl.END_OF_SPEECH, *tokens]
    got = tl.frames_from_flat_tokens(stream)
    np.testing.assert_array_equal(got.frames, frames)
    assert got.dropped_partial == 2
    assert got.ended


def test_token_in_wrong_codebook_slot_discards_that_frame():
    frames = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]])
    tokens = tl.flat_tokens_from_frames(frames)
    tokens[5] = tl.flat_token(6, 3)  # frame 1, slot 1 carries a codebook-4 id
    got = tl.frames_from_flat_tokens(tokens)
    np.testing.assert_array_equal(got.frames, frames[[0, 2]])
    # the partial frame [5], the misplaced code and the two orphaned codes of frame 1
    assert got.invalid == 4


def test_assembler_is_incremental():
    frames = np.arange(24).reshape(6, 4)
    tokens = [tl.START_OF_SPEECH, *tl.flat_tokens_from_frames(frames).tolist(), tl.END_OF_SPEECH, 70000]
    asm = tl.FlatFrameAssembler()
    got = [f for i in range(0, len(tokens), 3) for f in asm.feed(tokens[i : i + 3])]
    np.testing.assert_array_equal(np.array(got), frames)
    assert asm.ended and asm.pending == 0


def test_frames_pack_into_one_int_each_and_back():
    """The model packs codebooks 2-4 on the device (torch); the producer ORs in the cb1 code, one int per frame,
    and unpacks a whole window at once when it is sent."""
    import torch

    frames = np.random.default_rng(0).integers(0, tl.CODEBOOK_SIZE, size=(500, tl.NUM_CODEBOOKS))
    frames[0] = tl.CODEBOOK_SIZE - 1  # every bit of every field set
    frames[1] = 0
    codes = tl.pack_codes(torch.from_numpy(frames[:, 1:]))
    assert codes.dtype == torch.int64 and bool((codes >= 0).all())
    packed = [int(cb1) | (c << tl.CODE_BITS) for cb1, c in zip(frames[:, 0], codes.tolist(), strict=True)]
    assert packed == [tl.pack_frame(row) for row in frames.tolist()]
    np.testing.assert_array_equal(tl.unpack_frames(packed), frames)
    assert tl.unpack_frames([]).shape == (0, tl.NUM_CODEBOOKS)


def test_text_ids_are_the_tokenizer_call_s_ids(tmp_path):
    """The event loop's tokenization (the Rust ``encode`` where there is one) gives ``tokenizer(...)``'s ids for
    speakers, language tags, punctuation, Unicode, control-token look-alikes, whitespace runs, empty and long text;
    a tokenizer told to split special tokens goes through ``__call__`` and still agrees with it."""
    from transformers import AutoTokenizer

    from vllm_omni_kani.tools.tokenizer_factory import write_tokenizer

    write_tokenizer(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    assert tokenizer.backend_tokenizer is not None
    texts = [
        tl.speaker_text("Hello there, this is a test.", "andrew"),
        tl.speaker_text("Guten Tag!", None, "de"),
        "Ünïcödé — 你好, naïve café… «quotes» 123,456.78",
        "<|startoftext|> <|im_start|> </s> <s> [INST]",
        "  leading and   inner   whitespace \n\t newline ",
        "",
        "word " * 300,
    ]
    for text in texts:
        assert tl.text_ids(tokenizer, text) == list(tokenizer(text, add_special_tokens=True)["input_ids"]), text
    tokenizer.split_special_tokens = True
    for text in texts[3:5]:
        assert tl.text_ids(tokenizer, text) == list(tokenizer(text, add_special_tokens=True)["input_ids"]), text
