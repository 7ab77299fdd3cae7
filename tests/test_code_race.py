"""The code heads' one-kernel sampler (``code_race``) draws the codes of vLLM's torch form: the same temperature,
top-k and top-p filters and the same exponential race against the same noise, packed as ``pack_codes`` packs them
(compared on every code no float rounding could move across a filter's edge or the race's lead: two float forms).
On CPU the kernel runs under Triton's interpreter, in a subprocess because the interpreter is chosen when Triton
compiles the kernel's module. Also here: a request whose top-k is wider than a head row (vLLM's "no top-k" is the
whole vocabulary) samples as if unfiltered, where vLLM's torch form indexed out of range."""

from __future__ import annotations

import pytest
import torch
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch, sample_with_exponential_noise

from tests.conftest import run_python
from tests.test_code_sampler import metadata
from vllm_omni_kani.model_executor.models.kani_tts import token_layout as tl
from vllm_omni_kani.model_executor.models.kani_tts.code_race import GREEDY_EPS
from vllm_omni_kani.model_executor.models.kani_tts.code_sampler import race_noise, sample_codes

HEADS, SIZE = 3, tl.CODEBOOK_SIZE
# Triton's interpreter takes minutes over rows of 4,032 codes: the CPU test runs the kernel on narrower rows (not a
# power of two either, so the padding of the last block is covered); the CUDA test on the heads' own width.
INTERPRETED_SIZE = 200
VOCAB = 68442  # codebook 1's vocabulary: vLLM's top-k of a request without one
# Per request: temperature (0: greedy), top-k, top-p.
TEMPERATURES = (0.8, 0.0, 1.0, 0.6, 1.3, 0.9, 0.7)
TOP_K = (50, VOCAB, 10, 1, -100, 20, 0)  # -100, 0: 100 above the row's width, and the width itself
TOP_P = (0.9, 0.5, 1.0, 0.95, 0.3, 1.0, 0.8)
# A code counts as ambiguous when a float rounding could move it across a filter's edge or change the race's winner.
EDGE = 1e-4


def _metadata(device: str, top_k: bool, top_p: bool, size: int = SIZE):
    rows = len(TEMPERATURES)
    meta = metadata(rows, {row: 100 + row for row in range(rows)}, device=device)  # every row seeded: fixed noise
    meta.temperature = torch.tensor(TEMPERATURES, device=device)
    meta.all_random = False
    k = [value if value > 0 else size - value for value in TOP_K]
    meta.top_k = torch.tensor(k, dtype=torch.int32, device=device) if top_k else None
    meta.top_p = torch.tensor(TOP_P, device=device) if top_p else None
    return meta


def _reference(logits: torch.Tensor, meta, noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """vLLM's torch form on ``[R, K, C]`` logits with ``noise``: ``([R, K]`` codes, ``[R, K]`` unambiguous)."""
    rows, _, size = logits.shape
    temperature = torch.where(meta.temperature < GREEDY_EPS, torch.ones_like(meta.temperature), meta.temperature)
    flat = torch.div(logits, temperature.float().view(rows, 1, 1)).view(rows * HEADS, size)
    k = None if meta.top_k is None else meta.top_k.clamp(max=size).repeat_interleave(HEADS)
    p = None if meta.top_p is None else meta.top_p.repeat_interleave(HEADS)
    filtered = apply_top_k_top_p_pytorch(flat.clone(), k, p)
    probs = filtered.softmax(dim=-1)
    scores = probs / noise.view(rows * HEADS, size)
    sampled = sample_with_exponential_noise(probs.clone(), noise.view(rows * HEADS, size).clone())
    codes = torch.where((meta.temperature < GREEDY_EPS).unsqueeze(1), logits.argmax(-1), sampled.view(rows, HEADS))
    # Unambiguous: no kept code's probability-before within EDGE of p, and the race's winner clear of the runner-up.
    ranked = flat.masked_fill(filtered == float("-inf"), float("-inf")).sort(dim=-1, descending=True).values
    weights = ranked.softmax(dim=-1)
    before = weights.cumsum(dim=-1) - weights
    clear_p = torch.ones(rows * HEADS, dtype=torch.bool, device=logits.device)
    if p is not None:
        # (top-p 1 filters nothing: the probability before the last codes comes within rounding of 1)
        clear_p = ((before - p.unsqueeze(1)).abs() > EDGE).all(dim=-1) | (p >= 1.0)
    top2 = scores.topk(2, dim=-1).values
    clear_race = top2[:, 0] > top2[:, 1] * (1 + EDGE)
    return codes, (clear_p & clear_race).view(rows, HEADS)


def _kernel_against_reference(device: str, size: int = SIZE) -> None:
    """Raises AssertionError unless the kernel's packed codes are the torch form's for every unambiguous code."""
    from vllm_omni_kani.model_executor.models.kani_tts import code_race

    torch.manual_seed(0)
    logits = (3 * torch.randn(len(TEMPERATURES), HEADS, size, device=device)).to(torch.bfloat16)
    for top_k, top_p in ((False, False), (True, False), (False, True), (True, True)):
        meta = _metadata(device, top_k, top_p, size)
        noise = race_noise(logits, meta.generators)
        want, clear = _reference(logits, meta, noise)
        got = code_race.sample_packed(logits, meta.temperature, meta.top_k, meta.top_p, noise.view(len(want), -1))
        unpacked = _unpack(got)
        assert clear.float().mean() > 0.9, (top_k, top_p, clear)
        assert torch.equal(unpacked[clear], want[clear]), (top_k, top_p, unpacked, want, clear)
        # The filters bite: top-k 1 leaves each of its heads the argmax, and codes differ from greedy elsewhere.
        if top_k:
            chosen = logits[3].float().gather(-1, unpacked[3].unsqueeze(-1)).squeeze(-1)
            assert torch.equal(chosen, logits[3].float().amax(-1))  # (bfloat16 logits can tie at the top)
        assert torch.equal(unpacked[1], logits[1].float().argmax(-1))  # the greedy request
        assert not torch.equal(unpacked, logits.float().argmax(-1))
    greedy = code_race.sample_packed(logits, None, None, None, None)
    assert torch.equal(greedy, tl.pack_codes(logits.float().argmax(-1)))


def _dispatch_matches_the_torch_form(device: str, size: int = SIZE) -> None:
    """``sample_packed_codes`` with the switch taken gives ``pack_codes(sample_codes(...))``'s codes (CPU: vLLM's
    torch top-k/top-p), the noise being the same seeded hash."""
    from vllm_omni_kani.model_executor.models.kani_tts import code_race
    from vllm_omni_kani.model_executor.models.kani_tts.code_sampler import sample_packed_codes

    code_race.take()
    assert code_race.applies(torch.device(device), code_race.MAX_ROWS)
    assert not code_race.applies(torch.device(device), code_race.MAX_ROWS + 1)  # vLLM's batched kernels win there
    torch.manual_seed(1)
    logits = torch.randn(len(TEMPERATURES), HEADS, size, device=device)
    meta = _metadata(device, True, True, size)
    # Every row is seeded, so both forms race against the same hashed noise.
    _, clear = _reference(logits, meta, race_noise(logits, meta.generators))
    want, got = sample_codes(logits, meta), _unpack(sample_packed_codes(logits, meta))
    assert clear.float().mean() > 0.9
    assert torch.equal(got[clear], want[clear])
    assert torch.equal(sample_packed_codes(logits, None), tl.pack_codes(logits.argmax(-1)))


def _unpack(packed: torch.Tensor) -> torch.Tensor:
    """``[R]`` packed codes → ``[R, HEADS]``."""
    return torch.stack([(packed >> (k * tl.CODE_BITS)) & tl.CODE_MASK for k in range(HEADS)], dim=1)


def test_the_kernel_draws_the_torch_forms_codes_under_the_interpreter():
    code = (
        "import tests.test_code_race as t\n"
        "t._kernel_against_reference('cpu', t.INTERPRETED_SIZE)\n"
        # vLLM filters CPU rows with its torch form only where no GPU is: a CUDA build takes its own Triton kernel for
        # 8 rows and more, which the interpreter cannot run (the CUDA test below checks the dispatch compiled).
        "if not t.torch.cuda.is_available(): t._dispatch_matches_the_torch_form('cpu', t.INTERPRETED_SIZE)\n"
        "print('kernel ok')\n"
    )
    assert "kernel ok" in run_python(code, env={"TRITON_INTERPRET": "1"}).stdout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled kernel needs a CUDA device (CPU CI has none)")
def test_the_compiled_kernel_draws_the_torch_forms_codes_on_cuda(monkeypatch):
    from vllm_omni_kani.model_executor.models.kani_tts import code_race

    _kernel_against_reference("cuda")
    monkeypatch.setattr(code_race, "_taken", code_race._taken)  # the dispatch takes the switch: undone after the test
    _dispatch_matches_the_torch_form("cuda")


def test_the_switch_is_off_until_a_stage0_model_takes_it():
    from vllm_omni_kani.model_executor.models.kani_tts import code_race

    assert not code_race.applies(torch.device("cpu"), 1)  # on by default, but only a Stage-0 model takes it


def test_the_load_time_warm_up_brings_a_served_steps_dtypes():
    """vLLM builds and loads a model with its dtype as torch's default (bfloat16 here): the warm-up's tensors keep a
    served step's dtypes (vLLM's float32 temperature and top-p, int32 top-k, the race's float32 noise, the heads'
    logits in the model's dtype), else it compiles specialisations no step launches."""
    from vllm.utils.torch_utils import set_default_torch_dtype

    from vllm_omni_kani.model_executor.models.kani_tts import code_race

    with set_default_torch_dtype(torch.bfloat16):
        calls = code_race.warm_up_arguments(HEADS, SIZE, torch.bfloat16, torch.device("cpu"))
    # greedy, then each filter set
    present = [tuple(arg is not None for arg in call[1:4]) for call in calls]  # temperature, top-k, top-p
    assert present[0] == (False, False, False)
    assert present[1:] == [(True, False, False), (True, True, False), (True, False, True), (True, True, True)]
    for logits, temperature, top_k, top_p, noise in calls:
        assert logits.dtype == torch.bfloat16 and logits.shape == (1, HEADS, SIZE)
        assert all(arg is None or arg.dtype == torch.float32 for arg in (temperature, top_p, noise))
        assert top_k is None or top_k.dtype == torch.int32


def test_a_top_k_wider_than_a_head_row_samples_as_unfiltered():
    """vLLM gives a request without top-k its whole vocabulary as k; with the heads' rows 4,032 wide its codes are
    the unfiltered draw, in a batch beside a filtered request too."""
    torch.manual_seed(2)
    logits = torch.randn(2, HEADS, SIZE)
    meta = metadata(2, {0: 5, 1: 6})
    plain = sample_codes(logits, meta)
    for k in (VOCAB, SIZE + 1):
        meta.top_k = torch.tensor([k, 20], dtype=torch.int32)
        codes = sample_codes(logits, meta)
        assert torch.equal(codes[0], plain[0])
        assert bool((logits[1].topk(20, dim=-1).indices == codes[1].unsqueeze(-1)).any(-1).all())
