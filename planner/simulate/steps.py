"""An engine's steps read back from the client's token times.

Each step streams one token to every request it ran: a decode's next token, or the first
token of the request whose prefill it finished. Tokens that reach the client together
came from one step, and a decoding request's gap before its token is that step's length.
So a load run's records say what each step carried and how long it took, where a quiet
calibration only sees steps of one kind at a time: a step that finishes a prefill among a
full batch of decodes (a "mixed" step, the engine's every admission past the knee) is
measured as it ran.

What the client cannot see: a step that streams nothing (a long prompt's earlier chunks
with nothing decoding) is folded into the next step's gaps, and tokens the API server
streamed late in a bunch (a starved server) merge steps; such bunches are counted and left
out.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from planner.simulate.engine import EngineConfig, StepCost, pairs_of

# Tokens less than this share of the typical step apart are one step's.
SAME_STEP_SHARE = 0.35


@dataclass(frozen=True, slots=True)
class TokenTimes:
    """One request as the client saw it: its prompt's tokens, when its first token came
    (seconds, any clock shared by the run) and the gaps before each later one."""

    prompt_tokens: int
    first_s: float
    gaps_s: Sequence[float]


@dataclass(frozen=True, slots=True)
class ObservedStep:
    """One step: when its tokens came, its length (the median of its decodes' gaps; None
    when it decoded nothing), how many requests it decoded and their summed context (the
    attention pairs of their queries), and the prompts whose prefill it finished."""

    at_s: float
    seconds: float | None
    decodes: int
    decode_pairs: int
    prefills: tuple[int, ...]

    def features(self, config: EngineConfig) -> tuple[int, int, int, int]:
        """(tokens, sequences, attention pairs, cached tokens) as `StepCost.step_s` takes
        them; a prefill longer than what the step's budget left (after the decodes and the
        prefills before it) counts its last chunk only (and holds its whole prompt)."""
        tokens, pairs = self.decodes, self.decode_pairs
        room = max(config.max_num_batched_tokens - self.decodes, 1)
        for prompt in self.prefills:
            chunk = min(prompt, room)
            tokens += chunk
            pairs += pairs_of(chunk, prompt - chunk)
            room = max(room - chunk, 1)
        held = self.decode_pairs + sum(self.prefills)  # (a decode's pairs are its context)
        return tokens, self.decodes + len(self.prefills), pairs, held

    def modelled_s(self, cost: StepCost, config: EngineConfig) -> float:
        """What `cost` says this step takes."""
        tokens, seqs, pairs, held = self.features(config)
        return cost.step_s(tokens, held, seqs, pairs)


@dataclass(frozen=True, slots=True)
class Steps:
    """The steps a run's records show, and how many token bunches were left out."""

    steps: list[ObservedStep]
    merged: int  # bunches in which a request had two tokens: steps the client cannot part
    typical_s: float | None  # the median inter-token gap the bunching is judged on


def observed_steps(requests: Iterable[TokenTimes], same_step_s: float | None = None) -> Steps:
    """The steps behind `requests`' tokens: tokens closer than `same_step_s` (by default
    SAME_STEP_SHARE of the median gap) after the previous one are one step's."""
    times: list[float] = []
    owner: list[int] = []
    index: list[int] = []  # the token's place in its answer: 0 is the first
    prompts: list[int] = []
    gaps: list[float] = []
    for i, r in enumerate(requests):
        prompts.append(r.prompt_tokens)
        at = np.concatenate(([r.first_s], r.first_s + np.cumsum(r.gaps_s, dtype=float)))
        times.extend(at.tolist())
        owner.extend([i] * len(at))
        index.extend(range(len(at)))
        gaps.extend(r.gaps_s)
    positive = [g for g in gaps if g > 0]
    if not times or not positive:
        return Steps([], 0, None)
    typical = float(np.median(positive))
    tolerance = SAME_STEP_SHARE * typical if same_step_s is None else same_step_s
    every = np.asarray(times)
    order = np.argsort(every, kind="stable")
    at_sorted = every[order]
    # A new bunch wherever the next token is further than the tolerance from the last.
    starts = np.flatnonzero(np.diff(at_sorted, prepend=-np.inf) > tolerance)
    ends = np.append(starts[1:], len(order))
    steps: list[ObservedStep] = []
    merged = 0
    for start, end in zip(starts.tolist(), ends.tolist(), strict=True):
        members = order[start:end].tolist()
        who = [owner[m] for m in members]
        if len(set(who)) < len(who):
            merged += 1
            continue
        decode_gaps: list[float] = []
        decode_pairs = 0
        prefills: list[int] = []
        for m in members:
            k, prompt = index[m], prompts[owner[m]]
            if k == 0:
                prefills.append(prompt)
            else:
                # Tokens are listed answer by answer: the one before is its previous.
                decode_gaps.append(times[m] - times[m - 1])
                decode_pairs += prompt + k
        steps.append(
            ObservedStep(
                at_s=float(at_sorted[start]),
                seconds=float(np.median(decode_gaps)) if decode_gaps else None,
                decodes=len(decode_gaps),
                decode_pairs=decode_pairs,
                prefills=tuple(prefills),
            )
        )
    return Steps(steps, merged, typical)


# Decode-only steps of one batch size a slope needs, and the context bins it is read over.
SLOPE_STEPS_MIN = 100
SLOPE_BINS = 5


def context_slopes(steps: Iterable[ObservedStep]) -> dict[int, float]:
    """Seconds a decode step grows by per cached token, for each number of sequences it
    decoded (SLOPE_STEPS_MIN decode-only steps or more): a line through the medians of the
    steps' lengths in SLOPE_BINS bins of their summed context. Within one run the host's
    drift falls on short and long contexts alike, and the medians leave its stalls out.
    On the CPU engine a cached token cost a lone sequence several times what it cost each
    of eight (docs/simulator-log.md), which one `StepCost.kv_token_read_s` cannot price."""
    by_batch: dict[int, list[tuple[int, float]]] = {}
    for step in steps:
        if step.seconds is not None and step.decodes and not step.prefills:
            by_batch.setdefault(step.decodes, []).append((step.decode_pairs, step.seconds))
    slopes = {}
    for batch, found in sorted(by_batch.items()):
        if len(found) < SLOPE_STEPS_MIN:
            continue
        held = np.array([h for h, _ in found], dtype=float)
        seconds = np.array([s for _, s in found], dtype=float)
        edges = np.quantile(held, np.linspace(0.0, 1.0, SLOPE_BINS + 1))
        bins = np.clip(np.searchsorted(edges, held, side="right") - 1, 0, SLOPE_BINS - 1)
        x, y = [], []
        for i in range(SLOPE_BINS):
            inside = bins == i
            if inside.any():
                x.append(float(np.median(held[inside])))
                y.append(float(np.median(seconds[inside])))
        if len(set(x)) >= 2:
            slopes[batch] = float(np.polyfit(x, y, 1)[0])
    return slopes
