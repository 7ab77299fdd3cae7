"""Each stage's sampling parameters for one Kani request: copied at most once, never a shared default changed."""

from __future__ import annotations

from vllm.sampling_params import RequestOutputKind, SamplingParams

from vllm_omni_kani.entrypoints.openai.kani_submit import own_copy, stage_params


def defaults() -> list[SamplingParams]:
    return [SamplingParams(temperature=0.6, stop=["x"], max_tokens=100), SamplingParams(temperature=0.0)]


def test_streamed_requests_get_delta_copies_and_the_defaults_stay_as_they_were():
    shared = defaults()
    params = stage_params(shared, streaming=True)
    for mine, default in zip(params, shared, strict=True):
        assert mine is not default
        assert mine.output_kind == RequestOutputKind.DELTA and mine.skip_clone
        assert default.output_kind == RequestOutputKind.CUMULATIVE and not default.skip_clone
        assert mine.temperature == default.temperature and mine.max_tokens == default.max_tokens


def test_whole_answers_get_the_final_output_only():
    params = stage_params(defaults(), streaming=False)
    assert [p.output_kind for p in params] == [RequestOutputKind.FINAL_ONLY] * 2


def test_a_default_of_the_requested_kind_is_shared_and_other_entries_pass_through():
    delta = SamplingParams(output_kind=RequestOutputKind.DELTA)
    other = object()  # a stage whose parameters are not vLLM's SamplingParams (e.g. a diffusion stage's)
    params = stage_params([delta, other], streaming=True)
    assert params[0] is delta and params[1] is other


def test_a_request_setting_its_copy_leaves_the_default_unchanged():
    default = defaults()[0]
    mine = own_copy(default)
    mine.seed, mine.temperature, mine.stop_token_ids = 7, 1.0, [64402]
    assert (default.seed, default.temperature, default.stop_token_ids) == (None, 0.6, [])
    # vLLM's clone of a request-owned copy (the orchestrator's) is shallow: no deep copy a request.
    assert mine.clone() is not mine and mine.clone().stop == default.stop


def test_the_generic_submission_is_used_only_when_asked_for(monkeypatch):
    from vllm_omni_kani.entrypoints.openai.kani_speech import choose_submit
    from vllm_omni_kani.entrypoints.openai.kani_submit import submit_kani_speech
    from vllm_omni_kani.envs import KANI_GENERIC_SUBMIT

    async def generic(server, request, request_id, has_inline_ref_audio):
        raise AssertionError("only selected here, never called")

    monkeypatch.delenv(KANI_GENERIC_SUBMIT, raising=False)
    assert choose_submit(generic) is submit_kani_speech
    monkeypatch.setenv(KANI_GENERIC_SUBMIT, "1")
    assert choose_submit(generic) is generic
    assert choose_submit(None) is submit_kani_speech  # nothing generic to fall back on: Kani's own
