"""Workload profiles: lengths by seed, validation, and prompts of an exact token count."""

from __future__ import annotations

import asyncio
import itertools
from collections import Counter
from typing import Any

import numpy as np
import pytest

from planner.errors import InvalidInput, TargetError, UnknownChoice
from planner.workload import (
    PRESETS,
    EmpiricalProfile,
    FixedProfile,
    LengthDist,
    LognormalProfile,
    MixItem,
    MixProfile,
    MultiTurnProfile,
    Profile,
    RequestShape,
    SharedPrefixProfile,
    get_profile,
    parse_profile,
)
from probes.load.generator import RequestSpec, new_client, run_open_loop
from probes.load.workloads import PromptBuilder
from probes.vllm.client import AsyncVllmClient, Endpoint, Target
from tests.support.fake_openai import FakeConfig, FakeOpenAI, chat_tokens, serve, tokenize


def _build(
    fake: FakeOpenAI, shapes: list[RequestShape], seed: int = 0, chat: bool = False
) -> list[RequestSpec]:
    async def go() -> list[RequestSpec]:
        async with new_client() as client:
            vllm = AsyncVllmClient(Target(fake.url), client)
            return await PromptBuilder(vllm, "tiny-llama", chat=chat, seed=seed).build(shapes)

    return asyncio.run(go())


def _dist(median: float, sigma: float = 0.5, lo: int = 1, hi: int = 32768) -> LengthDist:
    return LengthDist(median=median, sigma=sigma, min=lo, max=hi)


# -- lengths -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_are_deterministic_for_a_seed(name: str) -> None:
    profile = get_profile(name)
    assert profile.shapes(200, seed=4) == profile.shapes(200, seed=4)
    if name != "fixed":
        assert profile.shapes(200, seed=4) != profile.shapes(200, seed=5)
    # A stored profile comes back as the same profile.
    assert parse_profile(profile.model_dump()) == profile
    assert parse_profile(name) == profile


def test_unknown_names_and_bad_parameters_are_refused_clearly() -> None:
    with pytest.raises(UnknownChoice, match="valid choices: chat, code-review, fixed"):
        get_profile("chatty")
    bad: list[tuple[dict[str, Any], str]] = [
        ({"kind": "fixed", "prompt_tokens": 0, "output_tokens": 4}, "prompt_tokens: Input should"),
        (
            {
                "kind": "lognormal",
                "prompt": {"median": 10, "min": 50, "max": 5},
                "output": {"median": 1},
            },
            r"min \(50\) is above max \(5\)",
        ),
        ({"kind": "empirical", "pairs": [[1, 2]], "weights": [1, 2]}, "2 weights for 1 pairs"),
        ({"kind": "empirical", "pairs": []}, "pairs: List should have at least 1 item"),
        ({"kind": "poisson"}, "does not match any of the expected tags"),
        ({"kind": "fixed", "prompt_tokens": 5, "output_tokens": 5, "extra": 1}, "extra: Extra"),
    ]
    for data, message in bad:
        with pytest.raises(InvalidInput, match=message) as err:
            parse_profile(data)
        assert str(err.value).startswith("invalid workload profile: profile")


def test_lognormal_lengths_have_their_median_and_stay_in_bounds() -> None:
    profile = LognormalProfile(prompt=_dist(300, 0.8, 20, 2000), output=_dist(50, 0.0))
    shapes = profile.shapes(5000, seed=1)
    prompts = np.asarray([s.prompt_tokens for s in shapes])
    assert prompts.min() >= 20 and prompts.max() <= 2000
    assert np.median(prompts) == pytest.approx(300, rel=0.05)
    assert (prompts == 2000).sum() > 0  # the clamp is hit, not a wider distribution
    assert {s.output_tokens for s in shapes} == {50}  # sigma 0: the median every time


def test_lengths_drawn_in_blocks_are_the_lengths_drawn_one_at_a_time() -> None:
    """The lognormal profile draws its lengths a block at a time (`LengthDist.lengths`);
    the other profiles draw one at a time (`draw`). Both are one formula: the same normal
    draws give the same lengths, clamps and halves (rounded to even) included."""
    profile = LognormalProfile(prompt=_dist(300, 0.8, 20, 2000), output=_dist(50.5, 0.0))
    rng = np.random.default_rng(4)
    pairs = [(profile.prompt.draw(rng), profile.output.draw(rng)) for _ in range(3000)]
    blocked = profile.shapes(3000, seed=4)
    assert [(s.prompt_tokens, s.output_tokens) for s in blocked] == pairs
    assert {o for _, o in pairs} == {50}  # 50.5 rounds to even, in both


def test_empirical_pairs_follow_their_weights() -> None:
    profile = EmpiricalProfile(pairs=[(10, 1), (100, 2), (1000, 3)], weights=[1, 2, 7])
    counts = Counter((s.prompt_tokens, s.output_tokens) for s in profile.shapes(10000, 2))
    assert set(counts) == {(10, 1), (100, 2), (1000, 3)}
    assert counts[(1000, 3)] / 10000 == pytest.approx(0.7, abs=0.02)
    assert counts[(10, 1)] / 10000 == pytest.approx(0.1, abs=0.02)


def test_an_empirical_trace_in_order_is_sent_as_recorded_and_again() -> None:
    trace = [(300, 2), (17, 1), (4000, 8)]
    shapes = EmpiricalProfile(pairs=trace, in_order=True).shapes(7, seed=5)
    assert [(s.prompt_tokens, s.output_tokens) for s in shapes] == [*trace, *trace, trace[0]]
    with pytest.raises(ValueError, match="a trace in order takes none"):
        EmpiricalProfile(pairs=trace, weights=[1, 1, 1], in_order=True)


def test_code_review_is_mostly_short_with_a_share_of_very_long_prompts() -> None:
    shapes = get_profile("code-review").shapes(5000, seed=3)
    long = [s for s in shapes if s.prompt_tokens >= 4000]
    assert len(long) / 5000 == pytest.approx(0.1, abs=0.015)
    assert {s.tags["component"] for s in long} == {"long"}
    short = sorted(s.prompt_tokens for s in shapes if s.tags["component"] == "short")
    assert short[len(short) // 2] == pytest.approx(400, rel=0.1)


def test_multi_turn_sessions_grow_in_order() -> None:
    profile = MultiTurnProfile(
        turns=4,
        sessions=3,
        first_prompt=_dist(100, 0.3),
        next_prompt=_dist(20, 0.3),
        output=_dist(30, 0.3),
        max_context=400,
    )
    shapes = profile.shapes(300, seed=9)
    by_session: dict[str, list[RequestShape]] = {}
    for s in shapes:
        assert s.session is not None and s.tags["session"] == s.session
        by_session.setdefault(s.session, []).append(s)
    assert len(by_session) >= 300 / 4
    for turns in by_session.values():
        assert [t.turn for t in turns] == list(range(len(turns))) and len(turns) <= 4
        for prev, nxt in itertools.pairwise(turns):
            # The whole previous exchange plus a new message.
            assert nxt.prompt_tokens > prev.prompt_tokens + prev.output_tokens
            assert nxt.prompt_tokens + nxt.output_tokens <= 400
    # Sessions run side by side: the first three requests open three sessions.
    assert [s.turn for s in shapes[:6]] == [0, 0, 0, 1, 1, 1]


def test_a_mix_draws_by_weight_and_keeps_components_apart() -> None:
    inner: Profile = SharedPrefixProfile(
        prefix_tokens=64, prefixes=2, suffix=_dist(8), output=_dist(8)
    )
    mix = MixProfile(
        components=[
            MixItem(weight=3, profile=FixedProfile(prompt_tokens=10, output_tokens=5)),
            MixItem(weight=1, profile=inner, name="a"),
            MixItem(weight=1, profile=inner, name="b"),
        ]
    )
    shapes = mix.shapes(5000, seed=0)
    components = Counter(s.tags["component"] for s in shapes)
    assert components["0"] / 5000 == pytest.approx(0.6, abs=0.03)
    assert {s.prefix[0] for s in shapes if s.prefix} == {"a.p0", "a.p1", "b.p0", "b.p1"}


# -- prompts -------------------------------------------------------------------------------


def test_prompts_have_the_exact_token_count_and_the_engine_agrees() -> None:
    shapes = [*get_profile("chat").shapes(60, seed=2), RequestShape(3, 2), RequestShape(1, 2)]
    with serve() as fake:
        specs = _build(fake, shapes, seed=2)
        assert [len(tokenize(s.prompt)) for s in specs] == [s.prompt_tokens for s in shapes]
        assert all(s.tags["exact_tokens"] is True for s in specs)
        assert len({s.prompt for s in specs}) == len(specs)  # no accidental shared prefixes

        async def send() -> list[int | None]:
            async with new_client() as client:
                ep = Endpoint(fake.url, "tiny-llama")
                result = await run_open_loop(client, ep, specs, [0.01 * i for i in range(62)])
                return [r.prompt_tokens for r in result.records]

        assert asyncio.run(send()) == [s.prompt_tokens for s in shapes]
        assert _build(fake, shapes, seed=2) == specs
        assert _build(fake, shapes, seed=3) != specs


def test_chat_prompts_are_counted_with_the_chat_template() -> None:
    shapes = [RequestShape(n, 4) for n in (12, 40, 99)]
    with serve() as fake:
        specs = _build(fake, shapes, chat=True)
    counts = [chat_tokens([{"role": "user", "content": s.prompt}]) for s in specs]
    assert counts == [12, 40, 99]


def test_a_shared_prefix_is_identical_and_exact() -> None:
    profile = SharedPrefixProfile(prefix_tokens=200, prefixes=3, suffix=_dist(30), output=_dist(8))
    shapes = profile.shapes(40, seed=1)
    with serve() as fake:
        specs = _build(fake, shapes)
    heads: dict[str, set[str]] = {}
    for shape, spec in zip(shapes, specs, strict=True):
        assert shape.prefix is not None
        words = spec.prompt.split()
        # Find the prefix by token count: the words that make exactly 200 tokens.
        cut = next(i for i in range(len(words) + 1) if len(tokenize(" ".join(words[:i]))) == 200)
        heads.setdefault(shape.prefix[0], set()).add(" ".join(words[:cut]))
        assert len(tokenize(spec.prompt)) == shape.prompt_tokens
    assert set(heads) == {"p0", "p1", "p2"}
    assert all(len(texts) == 1 for texts in heads.values())
    assert len({next(iter(t)) for t in heads.values()}) == 3


def test_each_turn_extends_the_previous_prompt_exactly() -> None:
    shapes = get_profile("multi-turn").shapes(40, seed=5)
    with serve() as fake:
        specs = _build(fake, shapes)
    last: dict[str, str] = {}
    for shape, spec in zip(shapes, specs, strict=True):
        assert spec.session == shape.session and spec.tags["turn"] == shape.turn
        assert len(tokenize(spec.prompt)) == shape.prompt_tokens
        if shape.turn > 0:
            assert shape.session is not None
            assert spec.prompt.startswith(last[shape.session] + " ")
        assert shape.session is not None
        last[shape.session] = spec.prompt


def test_without_tokenize_prompts_are_estimated_and_marked() -> None:
    shapes = [RequestShape(n, 4) for n in (50, 500, 2000)]
    with serve(FakeConfig(tokenize_endpoint=False)) as fake:
        specs = _build(fake, shapes)
    assert all(s.tags["exact_tokens"] is False for s in specs)
    for shape, spec in zip(shapes, specs, strict=True):
        assert len(tokenize(spec.prompt)) == pytest.approx(shape.prompt_tokens, rel=0.3)


def test_target_failures_and_impossible_prompts() -> None:
    with serve() as fake:
        url = fake.url
        with pytest.raises(InvalidInput, match="the shared part alone has"):
            shape = RequestShape(5, 1, prefix=("p", 300))
            _build(fake, [shape])
    with pytest.raises(TargetError, match=r"cannot connect to .*tokenize: connection refused"):
        _build(FakeOpenAI(FakeConfig(), url=url), [RequestShape(5, 1)])
