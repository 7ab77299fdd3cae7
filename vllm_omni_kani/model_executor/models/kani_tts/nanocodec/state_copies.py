"""The streams' conv states into and out of a ``[state | new]`` buffer, one Triton kernel each way (CUDA).

The stateful step (:mod:`.streaming`) prepends every row's state to each stateful layer's input and afterwards keeps
each row's last ``context`` valid inputs as its new state. In PyTorch that is four kernels a layer: ``index_select``
of the rows' slots into a temporary and its copy into the buffer; ``gather`` of each row's last inputs (at the row's
own length) into another temporary and ``index_copy_`` of it into the pool. Served at 256 streams those were
4.3-7.7% of the codec's kernel time (docs/BENCHMARKS.md, twenty-fourth and thirty-third sets), about 100 layers a
step. Here each way is one pass that reads its source once and writes its destination once, with no temporary:
:func:`load_states` and :func:`save_states`; :func:`load_states_torch` and :func:`save_states_torch` are PyTorch's
form, for CPUs and as the kernels' reference.

Both take the states as ``[rows, C, context]`` and the buffer as ``[B, C, T]`` by strides, so channel-major layers
and channels-last ones (``time_dim`` 1: ``[B, T, C]`` memory) go through the same kernel; Triton specializes unit
strides, so the contiguous dimension coalesces. Pure data movement: the result equals PyTorch's form bit for bit.
"""

from __future__ import annotations

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU wheels without Triton
    triton = None

# Elements a program moves: a tile of channels × the context (padded to a power of two).
TILE = 1024


def available() -> bool:
    """Whether the kernels can run here (Triton importable and a CUDA device present)."""
    return triton is not None and torch.cuda.is_available()


def _bct_strides(x: torch.Tensor, time_dim: int) -> tuple[int, int, int]:
    """(row, channel, time) strides of ``x``, time along ``time_dim`` (2: ``[B, C, T]``; 1: ``[B, T, C]``)."""
    if time_dim == 2:
        return x.stride(0), x.stride(1), x.stride(2)
    return x.stride(0), x.stride(2), x.stride(1)


def _tiles(channels: int, context: int) -> tuple[int, int]:
    block_t = triton.next_power_of_2(context)
    return max(1, min(triton.next_power_of_2(channels), TILE // block_t)), block_t


def _check(pool: torch.Tensor, joined: torch.Tensor, slots: torch.Tensor, time_dim: int) -> tuple[int, int, int]:
    """(rows, channels, context) of a step's copy between ``pool`` and ``joined``, after checking they fit."""
    if time_dim not in (1, 2):
        raise ValueError(f"time_dim must be 1 or 2; got {time_dim}")
    if pool.dtype != joined.dtype or pool.device != joined.device:
        raise ValueError(f"states ({pool.dtype}, {pool.device}) and buffer ({joined.dtype}, {joined.device}) differ")
    if pool.dim() != 3 or joined.dim() != 3 or slots.dim() != 1 or slots.shape[0] != joined.shape[0]:
        raise ValueError(f"states {tuple(pool.shape)}, buffer {tuple(joined.shape)}, slots {tuple(slots.shape)}")
    channel_dim = 3 - time_dim
    if pool.shape[channel_dim] != joined.shape[channel_dim]:
        raise ValueError(f"states {tuple(pool.shape)} and buffer {tuple(joined.shape)} hold different channels")
    return joined.shape[0], joined.shape[channel_dim], pool.shape[time_dim]


if triton is not None:

    @triton.jit
    def _copy_kernel(
        pool_ptr,
        slots_ptr,
        joined_ptr,
        lengths_ptr,
        channels,
        context,
        spr,
        spc,
        spt,
        sjb,
        sjc,
        sjt,
        SAVE: tl.constexpr,
        BLOCK_C: tl.constexpr,
        BLOCK_T: tl.constexpr,
    ):
        """Row ``b``'s tile of channels: its slot's state into the buffer's first ``context`` steps, or (``SAVE``)
        the buffer's steps ``lengths[b] .. lengths[b] + context`` into its slot's state."""
        b = tl.program_id(0).to(tl.int64)
        c = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
        t = tl.arange(0, BLOCK_T)
        mask = (c[:, None] < channels) & (t[None, :] < context)
        slot = tl.load(slots_ptr + b).to(tl.int64)
        state = pool_ptr + slot * spr + c[:, None] * spc + t[None, :] * spt
        if SAVE:
            start = tl.load(lengths_ptr + b).to(tl.int64)
            source = joined_ptr + b * sjb + c[:, None] * sjc + (start + t[None, :]) * sjt
            tl.store(state, tl.load(source, mask=mask), mask=mask)
        else:
            target = joined_ptr + b * sjb + c[:, None] * sjc + t[None, :] * sjt
            tl.store(target, tl.load(state, mask=mask), mask=mask)


def _launch(
    pool: torch.Tensor,
    slots: torch.Tensor,
    joined: torch.Tensor,
    lengths: torch.Tensor | None,
    time_dim: int,
) -> None:
    rows, channels, context = _check(pool, joined, slots, time_dim)
    if rows == 0 or context == 0:
        return
    block_c, block_t = _tiles(channels, context)
    _copy_kernel[(rows, triton.cdiv(channels, block_c))](
        pool,
        slots,
        joined,
        slots if lengths is None else lengths,  # unread without SAVE
        channels,
        context,
        *_bct_strides(pool, time_dim),
        *_bct_strides(joined, time_dim),
        SAVE=lengths is not None,
        BLOCK_C=block_c,
        BLOCK_T=block_t,
    )


def load_states_torch(pool: torch.Tensor, slots: torch.Tensor, joined: torch.Tensor, time_dim: int) -> None:
    """:func:`load_states` in PyTorch: an ``index_select`` into a temporary and its copy."""
    joined.narrow(time_dim, 0, pool.shape[time_dim]).copy_(pool.index_select(0, slots))


def save_states_torch(
    pool: torch.Tensor, slots: torch.Tensor, joined: torch.Tensor, span: torch.Tensor, time_dim: int
) -> None:
    """:func:`save_states` in PyTorch, ``span`` being ``[B, context]`` positions ``lengths[b] + 0 .. context - 1``:
    a ``gather`` into a temporary and its ``index_copy_``."""
    if time_dim == 2:
        take = span[:, None, :].expand(-1, joined.shape[1], -1)
    else:
        take = span[:, :, None].expand(-1, -1, joined.shape[2])
    pool.index_copy_(0, slots, torch.gather(joined, time_dim, take))


def load_states(pool: torch.Tensor, slots: torch.Tensor, joined: torch.Tensor, time_dim: int) -> None:
    """``joined``'s first ``context`` steps of row ``b`` = ``pool[slots[b]]`` (``context``: ``pool``'s length along
    ``time_dim``); what PyTorch writes as ``joined.narrow(time_dim, 0, context).copy_(pool.index_select(0, slots))``."""
    _launch(pool, slots, joined, None, time_dim)


def save_states(
    pool: torch.Tensor, slots: torch.Tensor, joined: torch.Tensor, lengths: torch.Tensor, time_dim: int
) -> None:
    """``pool[slots[b]]`` = ``joined``'s steps ``lengths[b] .. lengths[b] + context`` of row ``b``: each row's last
    ``context`` valid inputs, its valid inputs ending at ``context + lengths[b]``. Slots must be distinct."""
    if lengths.shape != slots.shape:
        raise ValueError(f"lengths {tuple(lengths.shape)} and slots {tuple(slots.shape)} differ")
    _launch(pool, slots, joined, lengths, time_dim)
