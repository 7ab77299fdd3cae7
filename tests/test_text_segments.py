"""Long input is split at sentence boundaries and no word is ever dropped or reordered."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vllm_omni_kani.entrypoints.openai.text_segments import split_sentences, split_text


def _words(text: str) -> list[str]:
    return text.split()


def test_sentences_and_packing():
    text = "Hello there. How are you? I am fine!  Thanks for asking… Bye."
    assert split_sentences(text) == ["Hello there.", "How are you?", "I am fine!", "Thanks for asking…", "Bye."]
    assert split_text(text, 30) == ["Hello there. How are you?", "I am fine! Thanks for asking…", "Bye."]
    assert split_text(text, 1000) == [" ".join(_words(text))]


def test_cjk_sentences_need_no_space():
    assert split_sentences("你好。今天天气很好！再见？") == ["你好。", "今天天气很好！", "再见？"]


def test_over_long_sentence_is_cut_at_clauses_then_words():
    sentence = "one two three, four five six seven; eight nine ten eleven twelve thirteen fourteen"
    segments = split_text(sentence, 20)
    assert all(len(s) <= 20 for s in segments)
    assert _words(" ".join(segments)) == _words(sentence)


def test_a_token_longer_than_a_segment_is_split_not_dropped():
    url = "https://example.com/" + "a" * 50
    segments = split_text(f"See {url} now.", 16)
    assert all(len(s) <= 16 for s in segments)
    assert "".join(segments).replace(" ", "") == f"See{url}now."


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=st.sampled_from([*"abc xyz.,!?;:。", "\n"]), max_size=400), limit=st.integers(5, 80))
def test_no_word_is_dropped(text, limit):
    segments = split_text(text, limit)
    assert all(0 < len(s) <= limit for s in segments)
    joined = "".join(s.replace(" ", "") for s in segments)
    assert joined == "".join(text.split())


def test_bad_limit():
    with pytest.raises(ValueError):
        split_text("x", 0)
