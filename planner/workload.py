"""Traffic as numbers: workload profiles (how long prompts and answers are, what requests
share) and arrival processes (when they come). One definition for the probes, which turn
shapes into real prompts and send them, and for the simulator, which runs them through a
modelled engine. A profile is a pydantic model with a `kind`, stored as JSON and selectable
by name from PRESETS; `profile.shapes(n, seed)` draws token lengths, the same for the same
seed.
"""

from __future__ import annotations

import itertools
from abc import ABC, abstractmethod
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Annotated, Any, Literal, TypeVar

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PositiveFloat,
    PositiveInt,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from planner.errors import InvalidInput, UnknownChoice, validation_message

M = TypeVar("M", bound=BaseModel)

# Lengths drawn at once by profiles that can (a draw ahead costs nothing).
_DRAWS_AHEAD = 256

# Prompt-length bands for runs without named classes: head-of-line blocking shows as the
# short band's TTFT rising while long prompts are in the mix.
PROMPT_BANDS: tuple[tuple[int, str], ...] = (
    (512, "prompt <= 512"),
    (2048, "prompt 513-2048"),
    (8192, "prompt 2049-8192"),
)


def shape_class(component: str | None, prompt_tokens: int | None) -> str:
    """A request's class: its component of a mixed profile, else its prompt band."""
    if component:
        return component
    if prompt_tokens is None:
        return "prompt unknown"
    for top, name in PROMPT_BANDS:
        if prompt_tokens <= top:
            return name
    return "prompt > 8192"


def validated(model: type[M], data: Mapping[str, Any], what: str) -> M:
    """`model(**data)`, with pydantic's complaints turned into one InvalidInput line."""
    try:
        return model.model_validate(dict(data))
    except ValidationError as err:
        raise InvalidInput(f"invalid {what}: {validation_message(err)}") from err


class Arrival(BaseModel):
    """When requests arrive: a process and its rate, turned into offsets for a seed.

    `cv` is the coefficient of variation of the gaps for `gamma` (1 is Poisson, above 1
    burstier); vllm bench's `--burstiness` is 1/cv². `ramp` goes from `rate` to `end_rate`
    linearly over `ramp_s` seconds, evenly spaced, then stays at `end_rate`.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["poisson", "gamma", "constant", "ramp"] = "poisson"
    rate: PositiveFloat
    cv: PositiveFloat = 1.0
    end_rate: PositiveFloat | None = None
    ramp_s: PositiveFloat | None = None

    @model_validator(mode="after")
    def _ramp_needs_its_end(self) -> Arrival:
        if self.kind == "ramp" and (self.end_rate is None or self.ramp_s is None):
            raise ValueError("a ramp needs end_rate and ramp_s")
        return self

    def offsets(self, n: int, seed: int = 0) -> list[float]:
        """`n` send times in seconds from the start, the first at 0; same seed, same times."""
        if n <= 0:
            return []
        rng = np.random.default_rng(seed)
        i = np.arange(n, dtype=float)
        if self.kind == "constant":
            t = i / self.rate
        elif self.kind == "ramp":
            assert self.end_rate is not None and self.ramp_s is not None
            a, b, span = self.rate, self.end_rate, self.ramp_s
            in_ramp = (a + b) / 2 * span  # arrivals during the ramp
            # Solve a*t + (b-a)/(2*span)*t² = i for the ramp part.
            k = (b - a) / (2 * span)
            # (Past the ramp a falling rate makes the root negative; those i are not used.)
            root = np.sqrt(np.maximum(a * a + 4 * k * i, 0.0))
            ramp_t = i / a if k == 0 else (root - a) / (2 * k)
            t = np.where(i <= in_ramp, ramp_t, span + (i - in_ramp) / b)
        else:
            cv = 1.0 if self.kind == "poisson" else self.cv
            gaps = rng.gamma(shape=1 / cv**2, scale=cv**2 / self.rate, size=n - 1)
            t = np.concatenate(([0.0], np.cumsum(gaps)))
        return [float(x) for x in t]

    def iter_offsets(self, seed: int = 0, chunk: int = 4096) -> Iterator[float]:
        """The send times of `offsets`, without end, made a chunk at a time (the simulator's
        100,000-request runs never hold their schedule). A ramp has no end to stream: it
        needs `offsets`."""
        if self.kind == "ramp":
            raise InvalidInput("a ramp's send times need a count: use offsets(n)")
        if self.kind == "constant":
            yield from (i / self.rate for i in itertools.count())
            return
        rng = np.random.default_rng(seed)
        cv = 1.0 if self.kind == "poisson" else self.cv
        t = 0.0
        yield t
        while True:
            gaps = rng.gamma(shape=1 / cv**2, scale=cv**2 / self.rate, size=chunk)
            for x in np.cumsum(np.concatenate(([t], gaps)))[1:].tolist():
                yield x
            t = x

    def stream(self, duration_s: float, seed: int = 0, chunk: int = 4096) -> Iterator[float]:
        """The send times in [0, duration_s), made a chunk at a time (a long run never holds
        its whole schedule). For a constant or ramped rate, the same times as `within`."""
        if self.kind in ("constant", "ramp"):
            yield from self.within(duration_s, seed)
            return
        rng = np.random.default_rng(seed)
        cv = 1.0 if self.kind == "poisson" else self.cv
        t = 0.0
        while t < duration_s:
            yield t
            for gap in rng.gamma(shape=1 / cv**2, scale=cv**2 / self.rate, size=chunk):
                t += float(gap)
                if t >= duration_s:
                    return
                yield t

    def expected(self, duration_s: float) -> int:
        """How many requests fall within `duration_s`, on average."""
        peak = max(self.rate, self.end_rate or 0.0)
        return max(1, round(peak * duration_s))

    def within(self, duration_s: float, seed: int = 0) -> list[float]:
        """Every send time in [0, duration_s): a constant 20/s for 1 s is 20 requests (how
        many is up to the process, for Poisson)."""
        peak = max(self.rate, self.end_rate or 0.0)
        n = int(peak * duration_s * 1.5) + 16
        while (t := self.offsets(n, seed))[-1] < duration_s:
            n *= 2
        return [x for x in t if x < duration_s]


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class LengthDist(_Model):
    """Lognormal token lengths: `median` and `sigma` of the log, clamped to [min, max].

    sigma 0 gives `median` every time.
    """

    median: PositiveFloat
    sigma: float = Field(0.5, ge=0, le=3)
    min: PositiveInt = 1
    max: PositiveInt = 32768

    @model_validator(mode="after")
    def _ordered(self) -> LengthDist:
        if self.min > self.max:
            raise ValueError(f"min ({self.min}) is above max ({self.max})")
        return self

    def draw(self, rng: np.random.Generator) -> int:
        x = self.median * float(np.exp(self.sigma * rng.standard_normal()))
        return int(min(max(round(x), self.min), self.max))

    def lengths(self, z: np.ndarray) -> list[int]:
        """`draw` for many standard normal draws `z` at once (the same lengths)."""
        x = self.median * np.exp(self.sigma * z)
        return np.clip(np.rint(x), self.min, self.max).astype(np.int64).tolist()  # type: ignore[no-any-return]


@dataclass(frozen=True)
class RequestShape:
    """Token lengths of one request and what it shares with others.

    `prefix` (key, tokens): the first tokens are the same text for every shape with that
    key. `session`/`turn`: turn k's prompt is turn k-1's prompt and answer (its first
    `context_tokens`) followed by new text. Of those, the first `repeated_tokens` (turn
    k-1's prompt) are its text verbatim; the answer's part is text of its length that
    stands in for it, since a load generator builds prompts before the answers exist.
    """

    prompt_tokens: int
    output_tokens: int
    prefix: tuple[str, int] | None = None
    session: str | None = None
    turn: int = 0
    context_tokens: int = 0
    repeated_tokens: int = 0
    tags: Mapping[str, Any] = field(default_factory=dict)


class _Profile(_Model, ABC):
    def shapes(self, n: int, seed: int = 0) -> list[RequestShape]:
        """`n` request shapes, the same for the same seed."""
        it = self.iter_shapes(np.random.default_rng(seed))
        return [next(it) for _ in range(n)]

    @abstractmethod
    def iter_shapes(self, rng: np.random.Generator) -> Iterator[RequestShape]:
        """Shapes without end, drawn from `rng`."""


class FixedProfile(_Profile):
    """Every request the same lengths (the OOM probe, a batch sweep, a quick latency check)."""

    kind: Literal["fixed"] = "fixed"
    prompt_tokens: PositiveInt
    output_tokens: PositiveInt

    def iter_shapes(self, rng: np.random.Generator) -> Iterator[RequestShape]:
        while True:
            yield RequestShape(self.prompt_tokens, self.output_tokens, tags={"profile": self.kind})


class LognormalProfile(_Profile):
    """Prompt and answer lengths drawn independently from lognormal distributions."""

    kind: Literal["lognormal"] = "lognormal"
    prompt: LengthDist
    output: LengthDist

    def iter_shapes(self, rng: np.random.Generator) -> Iterator[RequestShape]:
        # A block of draws at a time (the simulator takes 100,000): row-major, so the prompt
        # and answer of each request are the same draws as one pair at a time.
        while True:
            z = rng.standard_normal((_DRAWS_AHEAD, 2))
            for p, o in zip(
                self.prompt.lengths(z[:, 0]), self.output.lengths(z[:, 1]), strict=True
            ):
                yield RequestShape(p, o, tags={"profile": self.kind})


class EmpiricalProfile(_Profile):
    """(prompt, output) pairs replayed at random: a trace, or a histogram with `weights`;
    with `in_order`, the trace as recorded, from its first pair again past its last."""

    kind: Literal["empirical"] = "empirical"
    pairs: list[tuple[PositiveInt, PositiveInt]] = Field(min_length=1)
    weights: list[PositiveFloat] | None = None
    in_order: bool = False

    @model_validator(mode="after")
    def _one_weight_per_pair(self) -> EmpiricalProfile:
        if self.weights is not None and len(self.weights) != len(self.pairs):
            raise ValueError(f"{len(self.weights)} weights for {len(self.pairs)} pairs")
        if self.weights is not None and self.in_order:
            raise ValueError("weights draw pairs at random; a trace in order takes none")
        return self

    def iter_shapes(self, rng: np.random.Generator) -> Iterator[RequestShape]:
        if self.in_order:
            for prompt, output in itertools.cycle(self.pairs):
                yield RequestShape(prompt, output, tags={"profile": self.kind})
        p = None if self.weights is None else np.asarray(self.weights) / sum(self.weights)
        while True:
            prompt, output = self.pairs[int(rng.choice(len(self.pairs), p=p))]
            yield RequestShape(prompt, output, tags={"profile": self.kind})


class SharedPrefixProfile(_Profile):
    """A system prompt of `prefix_tokens` shared by all (the prefix-cache case), then a
    unique suffix. With `prefixes` > 1 each request takes one of that many at random."""

    kind: Literal["shared_prefix"] = "shared_prefix"
    prefix_tokens: PositiveInt
    prefixes: PositiveInt = 1
    suffix: LengthDist
    output: LengthDist

    def iter_shapes(self, rng: np.random.Generator) -> Iterator[RequestShape]:
        while True:
            key = f"p{int(rng.integers(self.prefixes))}"
            prompt = self.prefix_tokens + self.suffix.draw(rng)
            tags = {"profile": self.kind, "prefix": key}
            yield RequestShape(prompt, self.output.draw(rng), (key, self.prefix_tokens), tags=tags)


class MultiTurnProfile(_Profile):
    """Chat sessions whose context grows: turn k sends every earlier prompt and answer
    plus a new message (the earlier prompts verbatim, each answer as text of its length
    standing in for it). `sessions` run side by side, their turns interleaved, each sent
    once the session's previous answer is in; a session ends after `turns` turns or when
    the next would exceed `max_context` tokens."""

    kind: Literal["multi_turn"] = "multi_turn"
    turns: PositiveInt = 5
    sessions: PositiveInt = 8
    first_prompt: LengthDist
    next_prompt: LengthDist
    output: LengthDist
    max_context: PositiveInt = 8192

    def iter_shapes(self, rng: np.random.Generator) -> Iterator[RequestShape]:
        started = 0
        # (session, next turn, context so far, the last prompt's tokens)
        live: list[tuple[str, int, int, int]] = []
        while True:
            for slot in range(self.sessions):
                if slot == len(live):
                    live.append((f"s{started}", 0, 0, 0))
                    started += 1
                session, turn, context, last = live[slot]
                new = (self.first_prompt if turn == 0 else self.next_prompt).draw(rng)
                output = self.output.draw(rng)
                if turn > 0 and (turn >= self.turns or context + new + output > self.max_context):
                    session, turn, context, last = f"s{started}", 0, 0, 0
                    started += 1
                    new = self.first_prompt.draw(rng)
                prompt = context + new
                tags = {"profile": self.kind, "session": session, "turn": turn}
                yield RequestShape(
                    prompt, output, session=session, turn=turn, context_tokens=context,
                    repeated_tokens=last, tags=tags,
                )  # fmt: skip
                live[slot] = (session, turn + 1, prompt + output, prompt)


class MixItem(_Model):
    """One component of a mix: a profile and its weight (and a name for the records)."""

    weight: PositiveFloat
    profile: Profile
    name: str | None = None


class MixProfile(_Profile):
    """Each request drawn from one of the components with probability ∝ weight."""

    kind: Literal["mix"] = "mix"
    components: list[MixItem] = Field(min_length=1)

    def iter_shapes(self, rng: np.random.Generator) -> Iterator[RequestShape]:
        streams = [
            c.profile.iter_shapes(r)
            for c, r in zip(self.components, rng.spawn(len(self.components)), strict=True)
        ]
        weights = np.asarray([c.weight for c in self.components])
        p = weights / weights.sum()
        while True:
            i = int(rng.choice(len(streams), p=p))
            shape = next(streams[i])
            # Sessions and prefixes of different components must not meet.
            name = self.components[i].name or str(i)
            prefix = (
                None if shape.prefix is None else (f"{name}.{shape.prefix[0]}", shape.prefix[1])
            )
            session = None if shape.session is None else f"{name}.{shape.session}"
            tags = {**shape.tags, "component": name}
            if session is not None:
                tags["session"] = session
            yield replace(shape, prefix=prefix, session=session, tags=tags)


Profile = Annotated[
    FixedProfile
    | LognormalProfile
    | EmpiricalProfile
    | SharedPrefixProfile
    | MultiTurnProfile
    | MixProfile,
    Field(discriminator="kind"),
]
MixItem.model_rebuild()
_PROFILE: TypeAdapter[Profile] = TypeAdapter(Profile)


def _dist(median: float, sigma: float, lo: int, hi: int) -> LengthDist:
    return LengthDist(median=median, sigma=sigma, min=lo, max=hi)


PRESETS: dict[str, Profile] = {
    "fixed": FixedProfile(prompt_tokens=512, output_tokens=128),
    "chat": LognormalProfile(prompt=_dist(120, 0.6, 8, 1024), output=_dist(200, 0.8, 8, 1024)),
    # Mostly short, one in ten very long: the head-of-line blocking case.
    "code-review": MixProfile(
        components=[
            MixItem(
                weight=0.9,
                name="short",
                profile=LognormalProfile(
                    prompt=_dist(400, 0.5, 32, 2048), output=_dist(150, 0.5, 16, 512)
                ),
            ),
            MixItem(
                weight=0.1,
                name="long",
                profile=LognormalProfile(
                    prompt=_dist(6000, 0.15, 4000, 7000), output=_dist(300, 0.5, 16, 1024)
                ),
            ),
        ]
    ),
    "multi-turn": MultiTurnProfile(
        turns=5,
        sessions=8,
        first_prompt=_dist(200, 0.5, 16, 1024),
        next_prompt=_dist(60, 0.5, 4, 512),
        output=_dist(150, 0.6, 8, 512),
    ),
    "shared-prefix": SharedPrefixProfile(
        prefix_tokens=1024, suffix=_dist(64, 0.5, 4, 512), output=_dist(128, 0.5, 8, 512)
    ),
}


def get_profile(name: str) -> Profile:
    """The preset called `name`."""
    try:
        return PRESETS[name]
    except KeyError:
        raise UnknownChoice("workload profile", name, PRESETS) from None


def parse_profile(data: str | Mapping[str, Any]) -> Profile:
    """A preset name, or a stored profile (a mapping with `kind`), validated."""
    if isinstance(data, str):
        return get_profile(data)
    return validated(_ProfileField, {"profile": data}, "workload profile").profile


class _ProfileField(_Model):
    profile: Profile
