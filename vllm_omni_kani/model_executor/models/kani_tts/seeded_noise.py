"""Exp(1) noise for seeded requests: a counter-based hash of each request's seed and generator position.

Used for the code heads and, with ``codebook1_noise``, for codebook 1; a ``salt`` keys one use apart from any other
hash of the same seed and position.

The same seed at the same position gives the same noise row in any batch, and a new position gives fresh noise, so
a seeded request's codes do not depend on which other requests share its step. The hash is integer arithmetic: every
device computes the same bits, then one float conversion and a log. Two forms of one function:

- ``hashed_exponentials``: torch ops, on any device; the reference and the CPU path.
- ``scatter_hashed_exponentials``: one Triton kernel on CUDA that also writes each row into its batch row. The torch
  form launches ~50 elementwise kernels a step, a millisecond of host time at 256 seeded streams (py-spy of the
  sampled step at batch 256, docs/BENCHMARKS.md "Tenth set").
"""

from __future__ import annotations

import functools
import os
import zlib

import numpy as np
import torch

try:  # Triton itself, not vllm.triton_utils: the interpreter (TRITON_INTERPRET=1) lets the CPU tests run the kernel
    import triton
    import triton.language as tl
    from triton.language.extra import libdevice
except ImportError:  # pragma: no cover - every supported install has Triton
    triton = None

# Integers hold 32-bit values in int64 and every product stays inside int64 (no overflow, so every device computes
# the same bits); only the low 32 bits of each product are kept.
MASK32 = 0xFFFFFFFF
SALT = 0x6B43A9B5  # the code heads' noise: keys it apart from any other hash of the same seed and position
CODEBOOK1_SALT = 0x2C1B3C6D  # codebook 1's noise (vLLM's sampler, ``codebook1_noise``)
_MUL1, _MUL2 = 0x7FEB352D, 0x846CA68B  # C. Wellons' "lowbias32" multipliers
# Uniforms are (top 23 bits + 0.5) / 2**23: b + 0.5 needs 24 significant bits, exactly what a float32 holds, so every
# uniform is exact and the largest, 1 - 2**-24, stays below 1. With 24 bits the top value's + 0.5 rounded to 2**24:
# a uniform of 1.0 and noise of exactly 0 once in 2**24 draws, and a race's p / q was then 0 / 0 = NaN for a code
# of probability 0, which argmax picks (a code outside top-k / top-p, or a masked token).
_UNIFORM_BITS = 23
_BLOCK = 1024  # columns per Triton program
# Triton picks its interpreter when it decorates the kernel, at import: read once here too, not every step.
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


def generator_position(generator: torch.Generator) -> int:
    """Where a request's generator stands; it moves only when vLLM samples codebook 1 from it.

    vLLM draws from a seeded request's generator once per sampled step and rewinds it when it discards a step
    (CUDA: the Philox offset; CPU: ``patch.restore_discarded_generators_on_cpu`` restores the state), so the
    position names the step of that request alone. The heads read it and never advance it.
    """
    if generator.device.type == "cuda":
        return generator.get_offset()
    return zlib.crc32(generator.get_state().numpy().tobytes())


def _key_words(generators: list[torch.Generator], positions: list[int] | None = None) -> np.ndarray:
    """``[N, 4]`` int64: each generator's (seed low, seed high, position low, position high) 32-bit words; the
    positions are read from the generators unless given."""
    count = len(generators)
    if positions is None:
        positions = [generator_position(g) for g in generators]
    if len(positions) != count:
        raise ValueError(f"{len(positions)} positions for {count} generators")
    # Two flat arrays, not a list of pairs: this runs twice a step on every seeded row of Stage 0's batch.
    pairs = np.empty((count, 2), dtype=np.uint64)
    pairs[:, 0] = np.fromiter((g.initial_seed() for g in generators), dtype=np.uint64, count=count)
    pairs[:, 1] = np.fromiter(positions, dtype=np.uint64, count=count)
    words = np.empty((count, 2, 2), dtype=np.int64)  # [N, (seed, position), (low, high)]
    words[..., 0] = pairs & MASK32
    words[..., 1] = pairs >> np.uint64(32)
    return words.reshape(count, 4)


def seed_keys(generators: list[torch.Generator]) -> torch.Tensor:
    """``[N, 4]`` int64 host tensor of the generators' seed keys, ``hashed_exponentials``' input."""
    return torch.from_numpy(_key_words(generators))


def noise_table(rows: list[int], generators: list[torch.Generator], positions: list[int] | None = None) -> torch.Tensor:
    """``[N, 5]`` int64 host tensor: each seeded request's batch row, then its seed key (one copy to the device)."""
    return torch.from_numpy(np.column_stack([np.asarray(rows, dtype=np.int64), _key_words(generators, positions)]))


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """A bijection of 32-bit integers with full avalanche ("lowbias32"), elementwise on int64, in place."""
    x ^= x >> 16
    x *= _MUL1
    x &= MASK32
    x ^= x >> 15
    x *= _MUL2 - (1 << 32)  # the same low 32 bits as _MUL2, and |x * it| < 2**63
    x &= MASK32
    x ^= x >> 16
    return x


@functools.cache
def _mixed_columns(width: int, device: torch.device) -> torch.Tensor:
    """``_mix32`` of ``0..width-1``: the per-column half of every row's hash, the same every step (read, never
    written: callers combine it into new tensors)."""
    return _mix32(torch.arange(width, dtype=torch.long, device=device))


def hashed_exponentials(keys: torch.Tensor, width: int, salt: int = SALT) -> torch.Tensor:
    """``[N, 4]`` seed keys (``seed_keys``, on the target device) → ``[N, width]`` float32 Exp(1) noise."""
    row = _mix32(keys[:, 3] ^ salt)
    for column in (2, 1, 0):
        row = _mix32(row ^ keys[:, column])
    bits = _mix32(_mixed_columns(width, keys.device).unsqueeze(0) ^ row.unsqueeze(1))
    bits ^= _mix32(row ^ salt).unsqueeze(1)
    bits = _mix32(bits)
    bits >>= 32 - _UNIFORM_BITS
    return exponential_of_bits(bits)


def exponential_of_bits(bits: torch.Tensor) -> torch.Tensor:
    """``_UNIFORM_BITS``-bit integers → float32 Exp(1) noise, all in (0, 17]: ``-log((bits + 0.5) / 2**BITS)``."""
    return bits.to(torch.float32).add_(0.5).mul_(1.0 / (1 << _UNIFORM_BITS)).log_().neg_()


def seeded_exponentials(generators: list[torch.Generator], width: int, device: torch.device) -> torch.Tensor:
    """``[len(generators), width]`` float32 Exp(1) noise, each row a function of its generator's seed and position
    (torch ops)."""
    keys = seed_keys(generators)
    if device.type == "cuda":
        keys = keys.pin_memory()
    return hashed_exponentials(keys.to(device, non_blocking=True), width)


def write_seeded_rows(
    noise: torch.Tensor,
    generators: dict[int, torch.Generator],
    salt: int = SALT,
    positions: list[int] | None = None,
) -> None:
    """Overwrite the seeded rows of ``[R, width]`` noise with their hash (row ``i`` of ``generators`` maps batch
    rows to generators): one host table, one copy, then one kernel where it can run, else the torch ops."""
    table = noise_table(list(generators), list(generators.values()), positions)
    table = (table.pin_memory() if noise.is_cuda else table).to(noise.device, non_blocking=True)
    if noise.dtype == torch.float32 and noise.is_contiguous() and fused_kernel_available(noise.device):
        scatter_hashed_exponentials(noise, table, salt=salt)
    else:
        noise.index_copy_(0, table[:, 0], hashed_exponentials(table[:, 1:], noise.shape[1], salt=salt).to(noise.dtype))


def fused_kernel_available(device: torch.device) -> bool:
    """Whether ``scatter_hashed_exponentials`` can run on ``device`` (CUDA with Triton, or Triton's interpreter)."""
    return triton is not None and (device.type == "cuda" or _INTERPRETED)


def scatter_hashed_exponentials(out: torch.Tensor, table: torch.Tensor, salt: int = SALT) -> None:
    """``out[table[i, 0]] = hashed_exponentials(table[:, 1:], salt=salt)[i]`` in one kernel; ``out`` is
    ``[R, width]`` float32 and contiguous, ``table`` a ``noise_table`` on ``out``'s device."""
    count, width = table.shape[0], out.shape[1]
    if count == 0:
        return
    grid = (count, triton.cdiv(width, _BLOCK))
    _hashed_exponentials_kernel[grid](
        table.contiguous(), out, width, SALT=salt, BITS=_UNIFORM_BITS, BLOCK=_BLOCK, LIBDEVICE_LOG=out.is_cuda
    )


if triton is not None:
    # A jitted function reads globals only as constexprs.
    _MUL1_C, _MUL2_C = tl.constexpr(_MUL1), tl.constexpr(_MUL2)

    @triton.jit
    def _mix32_u32(x):
        # uint32 arithmetic wraps: the low 32 bits of the int64 form's products.
        x ^= x >> 16
        x *= _MUL1_C
        x ^= x >> 15
        x *= _MUL2_C
        x ^= x >> 16
        return x

    @triton.jit
    def _hashed_exponentials_kernel(
        table_ptr,
        out_ptr,
        width,
        SALT: tl.constexpr,
        BITS: tl.constexpr,
        BLOCK: tl.constexpr,
        LIBDEVICE_LOG: tl.constexpr,
    ):
        entry = table_ptr + tl.program_id(0) * 5  # batch row, then the four key words
        key = entry + 1
        row = _mix32_u32(tl.load(key + 3).to(tl.uint32) ^ SALT)
        row = _mix32_u32(row ^ tl.load(key + 2).to(tl.uint32))
        row = _mix32_u32(row ^ tl.load(key + 1).to(tl.uint32))
        row = _mix32_u32(row ^ tl.load(key).to(tl.uint32))
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        bits = _mix32_u32(_mix32_u32(cols.to(tl.uint32)) ^ row)
        bits ^= _mix32_u32(row ^ SALT)
        bits = _mix32_u32(bits) >> (32 - BITS)
        uniform = (bits.to(tl.float32) + 0.5) * (1.0 / (1 << BITS))
        # libdevice's logf is the one torch's CUDA log calls; the interpreter has only tl.log.
        noise = -(libdevice.log(uniform) if LIBDEVICE_LOG else tl.log(uniform))
        dest = out_ptr + tl.load(entry).to(tl.int64) * width
        tl.store(dest + cols, noise, mask=cols < width)
