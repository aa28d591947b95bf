"""Prompts for workload shapes: a `PromptBuilder` turns the token lengths a profile draws
(`planner.workload`, shared with the simulator) into prompts of an exact token count with
the target's own token counter, falling back to a words-per-token estimate (tagged
exact_tokens=false).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

from planner.errors import Cancelled, InvalidInput, KvscopeError, TargetError
from planner.workload import RequestShape
from probes.load.generator import RequestSpec
from probes.vllm.client import AsyncVllmClient

# Common English words, most of them one token in BPE vocabularies; a few longer ones so
# that a prompt cannot be fitted by counting words alone.
_WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no will can more other what time up about into than its only new some could these "
    "two may then do first any like now my such make over our even most after also did many "
    "before must through back years where much your way well down should because each just "
    "those people how too little state good very world still between government important "
    "however without another general against during something information development"
)
VOCAB = tuple(_WORDS.split())
# Words tried, in turn, where one word would overshoot the target by a token or more.
SHORT = ("a", "I", "the", "of", "and", "to", "in", "is", "it", "on")
WORDS_PER_TOKEN = 0.8  # VOCAB in tiny-llama's (Llama 3) tokenizer: 1.2 tokens a word
MAX_TRIES = 24
SESSIONS_KEPT = 4096
REFILL = 64  # prompts built at a time once a streamed run began


class PromptBuilder:
    """Prompts of an exact token count, counted by the target's own tokenizer.

    Text comes from a word stream seeded per request, so prompts differ (no accidental
    prefix-cache hits) yet are the same for the same seed. Fitting adds or removes words
    until the count is exact; the words-per-token ratio learned on the way and the word
    count that fitted each length make most later prompts exact at the first count.
    `chat` counts a prompt as the one user message of a chat completion.
    """

    def __init__(
        self,
        client: AsyncVllmClient,
        model: str,
        *,
        chat: bool = False,
        seed: int = 0,
        concurrency: int = 16,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> None:
        self.client, self.model = client, model
        self.cancelled = cancelled
        self.chat, self.seed = chat, seed
        self.exact: bool | None = None  # None until the first count says if the target can
        self.tokens_per_word = 1 / WORDS_PER_TOKEN
        self._fitted: dict[int, int] = {}  # tokens wanted -> words that fitted last time
        self._heads: dict[str, str] = {}  # shared prefixes by key
        self._known: dict[str, int] = {}  # token counts of heads: "" and shared prefixes
        self._slots = asyncio.Semaphore(concurrency)
        # The last prompt of each session (and its tokens), kept across builds: the newest
        # SESSIONS_KEPT only, since a finished session is never asked for again.
        self._history: OrderedDict[str, tuple[str, int]] = OrderedDict()
        self._built = 0  # prompts built so far: each one's text is seeded by its number

    async def build(self, shapes: Sequence[RequestShape]) -> list[RequestSpec]:
        """One RequestSpec per shape, in order; a session's turns are built one after another."""
        if not shapes:
            return []
        first, self._built = self._built, self._built + len(shapes)
        out: list[RequestSpec | None] = [None] * len(shapes)
        groups: dict[str, list[int]] = {}
        singles: list[int] = []
        for i, shape in enumerate(shapes):
            if shape.session is None:
                singles.append(i)
            else:
                groups.setdefault(shape.session, []).append(i)

        async def session(indices: list[int]) -> None:
            for i in indices:
                name = shapes[i].session
                assert name is not None
                spec = out[i] = await self._one(first + i, shapes[i], self._history.get(name))
                self._remember(name, spec.prompt, shapes[i].prompt_tokens)

        async def single(i: int) -> None:
            out[i] = await self._one(first + i, shapes[i], None)

        # The first prompt alone: it finds out whether the target counts and learns the ratio.
        if singles and singles[0] == 0:
            await single(singles.pop(0))
        elif groups:
            head = next(iter(groups.values()))
            if head[0] == 0:
                await session([head.pop(0)])
        await asyncio.gather(*map(single, singles), *map(session, groups.values()))
        return [x for x in out if x is not None]

    async def ahead(
        self, shapes: Iterator[RequestShape], window: int, refill: int = REFILL
    ) -> AsyncIterator[RequestSpec]:
        """Prompts for `shapes` without end: the first `window` built before this returns
        (before the run's clock starts), then `refill` more each time that many were used,
        so memory follows the window, not the run. Building counts each prompt with the
        target's tokenizer: a window built once the run began was load on the target beside
        the run's own (on the CPU engine a run past the knee that built 768 prompts in its
        first seconds finished 20-30 % fewer answers in its first 5 s and sent up to 1.2 s
        late); a few dozen at a time keeps the counting as even as the sends."""
        window = max(1, window)
        ready: asyncio.Queue[RequestSpec] = asyncio.Queue(maxsize=window)
        for spec in await self.build(list(itertools.islice(shapes, window))):
            ready.put_nowait(spec)
        return self._refilled(ready, shapes, max(1, min(refill, window // 2)))

    async def _refilled(
        self, ready: asyncio.Queue[RequestSpec], shapes: Iterator[RequestShape], refill: int
    ) -> AsyncIterator[RequestSpec]:
        low = ready.maxsize - refill  # (build again once the window is down to this)
        room = asyncio.Event()

        async def produce() -> None:
            while not self.cancelled():
                while ready.qsize() > low:
                    room.clear()
                    await room.wait()
                for spec in await self.build(list(itertools.islice(shapes, refill))):
                    await ready.put(spec)

        producer = asyncio.get_running_loop().create_task(produce())
        try:
            while True:
                getter = asyncio.ensure_future(ready.get())
                await asyncio.wait({getter, producer}, return_when=asyncio.FIRST_COMPLETED)
                if getter.done():
                    if ready.qsize() <= low:
                        room.set()
                    yield getter.result()
                    continue
                getter.cancel()
                producer.result()  # the producer failed (a target error): raise it here
                return
        finally:
            producer.cancel()
            with contextlib.suppress(asyncio.CancelledError, KvscopeError):
                await producer

    def _remember(self, session: str, prompt: str, tokens: int) -> None:
        self._history[session] = (prompt, tokens)
        self._history.move_to_end(session)
        while len(self._history) > SESSIONS_KEPT:
            self._history.popitem(last=False)

    async def _one(
        self, index: int, shape: RequestShape, history: tuple[str, int] | None
    ) -> RequestSpec:
        """The request for `shape`; `history` is the session's previous prompt and its tokens."""
        if self.cancelled():
            raise Cancelled("cancelled on request while prompts were built; nothing was sent")
        head, base = "", None
        if history is not None:
            head, base = history[0], history[1] if self.exact else None
        elif shape.prefix is not None:
            head = await self._prefix(*shape.prefix)
        rng = random.Random(f"{self.seed}:{index}")
        text = await self.fit(head, shape.prompt_tokens, rng, base)
        tags = {**shape.tags, "exact_tokens": bool(self.exact)}
        return RequestSpec(text, shape.output_tokens, shape.session, tags)

    async def _prefix(self, key: str, tokens: int) -> str:
        """The shared head for `key`, fitted once."""
        name = f"{key}:{tokens}"
        if name not in self._heads:
            text = await self.fit("", tokens, random.Random(f"{self.seed}:{name}"))
            self._heads[name] = text
            if self.exact:
                self._known[text] = tokens
        return self._heads[name]

    async def fit(self, head: str, target: int, rng: random.Random, base: int | None = None) -> str:
        """`head` (of `base` tokens, if known) followed by words from `rng`, `target` tokens in
        all: exactly, when the target counts tokens."""
        base = base if base is not None else self._known.get(head)
        if base is None:
            base = await self.count(head)
            if base is None:
                return _join(head, [rng.choice(VOCAB) for _ in range(_approx(target, head))])
            if not head:
                self._known[head] = base
        if base > target:
            raise InvalidInput(f"cannot fit {target} tokens: the shared part alone has {base}")
        need = target - base
        if need == 0:
            return head
        words: list[str] = []
        short = iter(SHORT * 4)
        # Word counts known to give too few (lo) and too many (hi) tokens.
        lo, hi = 0, None
        k = self._fitted.get(need, max(1, round(need / self.tokens_per_word)))
        for _ in range(MAX_TRIES):
            while len(words) < k:
                words.append(rng.choice(VOCAB))
            n = await self.count(_join(head, words[:k]))
            assert n is not None  # None only when the very first count finds no counter
            if n == target:
                self._fitted[need] = k
                self.tokens_per_word = 0.8 * self.tokens_per_word + 0.2 * (n - base) / k
                return _join(head, words[:k])
            if n < target:
                lo = max(lo, k)
            else:
                hi = k if hi is None else min(hi, k)
            if hi == lo + 1:
                # Word `lo` alone jumps past the target: put a short word in its place.
                words[lo] = next(short, "a")
                k, hi = lo + 1, None
                continue
            step = max(1, round(abs(target - n) / self.tokens_per_word))
            k = k + step if n < target else k - step
            if k <= lo or (hi is not None and k >= hi):
                k = lo + 1 if hi is None else (lo + hi) // 2
        raise TargetError(
            f"could not build a prompt of exactly {target} tokens with the target's tokenizer "
            f"after {MAX_TRIES} tries"
        )

    async def count(self, text: str) -> int | None:
        """Tokens of `text` as the target counts them; None when it cannot count."""
        if self.exact is False:
            return None
        async with self._slots:
            n = await self.client.count_tokens(self.model, text, chat=self.chat)
        if n is None and self.exact is None:
            self.exact = False  # not a vLLM server: estimate from here on
            return None
        if n is None:
            raise TargetError(f"{self.client.base_url} stopped counting tokens mid-run")
        self.exact = True
        return n


def _join(head: str, words: Sequence[str]) -> str:
    tail = " ".join(words)
    return f"{head} {tail}" if head and tail else head or tail


def _approx(target: int, head: str) -> int:
    """Words to add to `head` for `target` tokens by the rule of thumb (one BOS token)."""
    have = 1 + len(head.split()) / WORDS_PER_TOKEN if head else 1
    return max(0, round((target - have) * WORDS_PER_TOKEN))
