"""Contiguous max-length reservation versus paged blocks: how much KV memory each wastes.

Before paged attention, servers reserved a contiguous KV slab of the maximum length for
every request; vLLM allocates fixed-size blocks as tokens arrive. Given prompt and output
lengths this computes, exactly and in closed form, the share of reserved KV memory that
holds no token, averaged over every decoding step of every request.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from statistics import NormalDist

import numpy as np
import numpy.typing as npt

from planner.errors import InvalidInput


class LengthDistribution(StrEnum):
    """Shapes of output-length distributions the planner can generate."""

    FIXED = "fixed"
    UNIFORM = "uniform"
    EXPONENTIAL = "exponential"
    LOGNORMAL = "lognormal"


def output_lengths(
    kind: str, mean: float, maximum: int, n: int = 1000, sigma: float = 1.0
) -> npt.NDArray[np.int64]:
    """n deterministic output lengths (distribution quantiles, no randomness), in 1..maximum."""
    if n < 1 or maximum < 1 or mean <= 0:
        raise InvalidInput("output lengths need n >= 1, a positive mean and a positive maximum")
    try:
        shape = LengthDistribution(kind)
    except ValueError:
        raise InvalidInput(
            f"unknown output-length distribution {kind!r}; valid choices: "
            + ", ".join(d.value for d in LengthDistribution)
        ) from None
    q = (np.arange(n) + 0.5) / n
    if shape is LengthDistribution.FIXED:
        values = np.full(n, mean)
    elif shape is LengthDistribution.UNIFORM:
        values = 1 + q * (2 * mean - 1)
    elif shape is LengthDistribution.EXPONENTIAL:
        values = -mean * np.log1p(-q)
    else:
        # Lognormal with the given mean: mu = ln(mean) - sigma^2 / 2.
        z = np.array([NormalDist().inv_cdf(float(x)) for x in q])
        values = np.exp(np.log(mean) - sigma**2 / 2 + sigma * z)
    out: npt.NDArray[np.int64] = np.clip(np.rint(values), 1, maximum).astype(np.int64)
    return out


def _ceil_sum(n: npt.NDArray[np.int64], block: int) -> npt.NDArray[np.int64]:
    """sum_{k=1..n} ceil(k / block), in closed form."""
    q, r = np.divmod(n, block)
    out: npt.NDArray[np.int64] = block * q * (q + 1) // 2 + r * (q + 1)
    return out


@dataclass(frozen=True, slots=True)
class FragmentationResult:
    """Wasted share of KV memory, time-averaged over decoding, for both allocators."""

    block_size: int
    reserve_tokens: int
    requests: int
    mean_prompt: float
    mean_output: float
    used_token_steps: int
    contiguous_token_steps: int
    paged_token_steps: int

    @property
    def contiguous_waste(self) -> float:
        """Share of a max-length contiguous reservation that holds no token (0..1)."""
        return 1 - self.used_token_steps / self.contiguous_token_steps

    @property
    def paged_waste(self) -> float:
        """Share of allocated paged blocks that holds no token (only each last block)."""
        return 1 - self.used_token_steps / self.paged_token_steps

    @property
    def capacity_gain(self) -> float:
        """How many times more concurrent requests paged allocation fits in the same bytes."""
        return self.contiguous_token_steps / self.paged_token_steps


def fragmentation(
    prompt_lengths: npt.ArrayLike,
    output_lengths: npt.ArrayLike,
    reserve_tokens: int,
    block_size: int = 16,
) -> FragmentationResult:
    """Compare a contiguous reservation of `reserve_tokens` per request with paged blocks.

    At decoding step t (1..output) a request holds prompt + t tokens. The contiguous
    scheme has reserved `reserve_tokens` from the start; the paged scheme holds
    ceil((prompt + t) / block_size) blocks. Sums over all steps of all requests give the
    time-averaged occupancy of each scheme.
    """
    p = np.atleast_1d(np.asarray(prompt_lengths, dtype=np.int64))
    o = np.atleast_1d(np.asarray(output_lengths, dtype=np.int64))
    p, o = np.broadcast_arrays(p, o)
    if block_size < 1:
        raise InvalidInput(f"block size must be at least 1, got {block_size}")
    if p.size == 0 or (p < 0).any() or (o < 1).any():
        raise InvalidInput("need at least one request, prompts >= 0 and outputs >= 1 tokens")
    longest = int((p + o).max())
    if reserve_tokens < longest:
        raise InvalidInput(
            f"a contiguous reservation of {reserve_tokens} tokens cannot hold the longest "
            f"request ({longest} tokens); reserve at least that many"
        )
    used = int((o * p + o * (o + 1) // 2).sum())
    contiguous = int((o * reserve_tokens).sum())
    paged = int((block_size * (_ceil_sum(p + o, block_size) - _ceil_sum(p, block_size))).sum())
    return FragmentationResult(
        block_size=block_size,
        reserve_tokens=reserve_tokens,
        requests=int(p.size),
        mean_prompt=float(p.mean()),
        mean_output=float(o.mean()),
        used_token_steps=used,
        contiguous_token_steps=contiguous,
        paged_token_steps=paged,
    )
