"""Build a tiny random-weight Llama and a locally trained tokenizer for the CPU engine.

Runs inside the engine's virtual environment (stdlib + torch + transformers + tokenizers);
the project imports it only for `TinyParams` and `command()`, so the heavy imports live
inside functions. Same parameters, same bytes: the weights come from a seeded generator and
the tokenizer from a built-in deterministic corpus, so nothing is ever downloaded.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

FORMAT_VERSION = 1
MARKER = "kvscope-tiny.json"
SCRIPT = Path(__file__).resolve()
DTYPES = ("float32", "bfloat16", "float16")
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    MARKER,
)
BOS, EOS, PAD = "<|begin_of_text|>", "<|end_of_text|>", "<|pad|>"
TURN_START, TURN_END = "<|start|>", "<|end|>"
SPECIAL_TOKENS = (BOS, EOS, PAD, TURN_START, TURN_END)
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "<|start|>{{ message['role'] }}\n{{ message['content'] }}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)
CORPUS_SEED = 20240611  # the tokenizer depends on the vocab size only, not on --seed

_WORD_TEXT = (
    "the of and to in is was for on that with as by at from it be this are have an or not "
    "but had his they which one you were her all she there would their we him been has when "
    "who will more no if out so said what up its about into than them can only other new some "
    "could time these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men "
    "work long get here between both life being under never day same another know while last "
    "might us great old year off come since against go came right used take three cache memory "
    "block token request latency queue engine model server metric prompt decode prefill batch "
    "kernel tensor layer head attention throughput capacity budget page fragment scheduler "
    "preemption sequence context window usage percentile histogram counter gauge sample probe"
)
_WORDS = _WORD_TEXT.split()
_ONSETS = (
    "",
    "b",
    "c",
    "d",
    "f",
    "g",
    "h",
    "k",
    "l",
    "m",
    "n",
    "p",
    "r",
    "s",
    "t",
    "v",
    "z",
    "br",
    "ch",
    "cl",
    "dr",
    "gr",
    "pl",
    "sh",
    "st",
    "th",
    "tr",
)
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ea", "io", "ou")
_CODAS = ("", "", "n", "r", "s", "t", "l", "m", "nd", "st", "ng")


@dataclasses.dataclass(frozen=True)
class TinyParams:
    """Shape of the tiny model; `intermediate=0` means 4 x hidden."""

    seed: int = 0
    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    head_dim: int = 32
    intermediate: int = 0
    vocab: int = 4096
    max_pos: int = 8192
    dtype: str = "float32"

    def resolved(self) -> TinyParams:
        """Same parameters with defaults filled in, validated."""
        inter = self.intermediate or 4 * self.hidden
        checks = {
            "layers": self.layers >= 1,
            "hidden": self.hidden >= 8,
            "heads": self.heads >= 1,
            "kv_heads": 1 <= self.kv_heads <= self.heads and self.heads % self.kv_heads == 0,
            "head_dim": self.head_dim >= 8 and self.head_dim % 2 == 0,
            "intermediate": inter >= 1,
            "vocab": self.vocab >= 512,
            "max_pos": self.max_pos >= 16,
            "dtype": self.dtype in DTYPES,
        }
        bad = [name for name, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid tiny model parameters: {', '.join(bad)} ({self})")
        return dataclasses.replace(self, intermediate=inter)


def argv(out: str | os.PathLike[str], params: TinyParams) -> list[str]:
    """Arguments (after the script path) that build `params` into `out`."""
    return [
        "--out", str(out),
        "--seed", str(params.seed),
        "--layers", str(params.layers),
        "--hidden", str(params.hidden),
        "--heads", str(params.heads),
        "--kv-heads", str(params.kv_heads),
        "--head-dim", str(params.head_dim),
        "--intermediate", str(params.intermediate),
        "--vocab", str(params.vocab),
        "--max-pos", str(params.max_pos),
        "--dtype", params.dtype,
    ]  # fmt: skip


def command(
    python: str | os.PathLike[str], out: str | os.PathLike[str], params: TinyParams
) -> list[str]:
    """Full command line: the engine venv's python running this script."""
    return [str(python), str(SCRIPT), *argv(out, params)]


def parse_args(args: list[str] | None = None) -> tuple[Path, TinyParams]:
    """Parse the CLI into the output folder and resolved parameters."""
    d = TinyParams()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--out", required=True, type=Path, help="model folder to (re)build")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--kv-heads", type=int, default=d.kv_heads)
    p.add_argument("--head-dim", type=int, default=d.head_dim)
    p.add_argument("--intermediate", type=int, default=d.intermediate, help="0: 4 x hidden")
    p.add_argument("--vocab", type=int, default=d.vocab)
    p.add_argument("--max-pos", type=int, default=d.max_pos)
    p.add_argument("--dtype", choices=DTYPES, default=d.dtype)
    ns = p.parse_args(args)
    params = TinyParams(
        seed=ns.seed, layers=ns.layers, hidden=ns.hidden, heads=ns.heads, kv_heads=ns.kv_heads,
        head_dim=ns.head_dim, intermediate=ns.intermediate, vocab=ns.vocab, max_pos=ns.max_pos,
        dtype=ns.dtype,
    )  # fmt: skip
    try:
        return ns.out, params.resolved()
    except ValueError as err:
        p.error(str(err))
        raise  # unreachable: p.error exits


def marker_payload(params: TinyParams) -> dict[str, Any]:
    """What the marker file records; a folder is complete when this matches."""
    return {"format": FORMAT_VERSION, "params": dataclasses.asdict(params.resolved())}


def is_complete(out: Path, params: TinyParams) -> bool:
    """True when `out` already holds a finished build of exactly `params`."""
    if not all((out / name).is_file() for name in REQUIRED_FILES):
        return False
    try:
        recorded = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    want = marker_payload(params)
    return bool(
        recorded.get("format") == want["format"] and recorded.get("params") == want["params"]
    )


def corpus(n_lines: int = 12000) -> list[str]:
    """Deterministic training text: English-ish words, made-up words, numbers, code, JSON."""
    rng = random.Random(CORPUS_SEED)

    def made_up() -> str:
        return "".join(
            rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS)
            for _ in range(rng.randint(1, 3))
        )

    lines = []
    for i in range(n_lines):
        kind = i % 10
        if kind < 6:
            words = [
                rng.choice(_WORDS) if rng.random() < 0.7 else made_up()
                for _ in range(rng.randint(6, 24))
            ]
            sentence = " ".join(words)
            lines.append(sentence[0].upper() + sentence[1:] + rng.choice(".!?;:,"))
        elif kind == 6:
            lines.append(
                f"{rng.randint(0, 10 ** rng.randint(1, 9))} {rng.random():.4f} "
                f"{rng.choice(_WORDS)}={rng.randint(-999, 999)}"
            )
        elif kind == 7:
            name = made_up()
            fn, op = rng.choice(_WORDS), rng.choice("+-*/%")
            lines.append(
                f"def {name}_{fn}(x, y):\n    return x {op} y  # {rng.choice(_WORDS)} {made_up()}"
            )
        elif kind == 8:
            lines.append(
                json.dumps(
                    {
                        rng.choice(_WORDS): rng.randint(0, 9999),
                        "name": made_up(),
                        "ok": rng.random() < 0.5,
                    }
                )
            )
        else:
            lines.append(
                f"<{made_up()}>{made_up().capitalize()} ({rng.randint(1, 99)}%) "
                f"[{made_up()}] {{ {rng.choice(_WORDS)} }} \"{made_up()}\" 'x' \t|"
            )
    return lines


def build_tokenizer(vocab: int) -> Any:
    """Byte-level BPE trained on `corpus()`, wrapped as a PreTrainedTokenizerFast."""
    from tokenizers import (  # type: ignore[import-not-found,unused-ignore]
        Tokenizer,
        decoders,
        models,
        pre_tokenizers,
        processors,
        trainers,
    )
    from transformers import PreTrainedTokenizerFast  # type: ignore[import-not-found,unused-ignore]

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    bos_id = tok.token_to_id(BOS)
    # Llama style: a BOS before every encoded text, nothing after.
    tok.post_processor = processors.TemplateProcessing(
        single=f"{BOS} $A", pair=f"{BOS} $A {BOS} $B", special_tokens=[(BOS, bos_id)]
    )
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        model_max_length=1 << 30,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(params: TinyParams, vocab_size: int, bos_id: int, eos_id: int, pad_id: int) -> Any:
    """Random-weight LlamaForCausalLM from a seeded generator, cast to `params.dtype`."""
    import torch  # type: ignore[import-not-found,unused-ignore]
    from transformers import (  # type: ignore[import-not-found,unused-ignore]
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=params.hidden,
        intermediate_size=params.intermediate,
        num_hidden_layers=params.layers,
        num_attention_heads=params.heads,
        num_key_value_heads=params.kv_heads,
        head_dim=params.head_dim,
        max_position_embeddings=params.max_pos,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        tie_word_embeddings=False,
        rms_norm_eps=1e-5,
    )
    torch.manual_seed(params.seed)
    with torch.no_grad():
        model = LlamaForCausalLM(config)
        # Draw every parameter ourselves, in name order, so the bytes do not depend on
        # how a transformers release happens to initialise modules.
        gen = torch.Generator().manual_seed(params.seed)
        for name, tensor in sorted(model.named_parameters()):
            if name.endswith("norm.weight"):
                tensor.fill_(1.0)
            else:
                tensor.copy_(torch.randn(tensor.shape, generator=gen, dtype=torch.float32) * 0.02)
    model = model.to(getattr(torch, params.dtype))
    model.generation_config = GenerationConfig(
        bos_token_id=bos_id, eos_token_id=eos_id, pad_token_id=pad_id
    )
    return model


def _portable_tokenizer_class(path: Path) -> None:
    """Name the class transformers 4 also knows; transformers 5 maps it to its own backend."""
    cfg = json.loads(path.read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    path.write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")


def build(out: Path, params: TinyParams) -> bool:
    """Build `params` into `out` unless it is already there; True when something was built."""
    params = params.resolved()
    out = out.resolve()
    if is_complete(out, params):
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        tokenizer = build_tokenizer(params.vocab)
        ids = [tokenizer.convert_tokens_to_ids(t) for t in (BOS, EOS, PAD)]
        model = build_model(params, len(tokenizer), *ids)
        model.save_pretrained(work, safe_serialization=True)
        tokenizer.save_pretrained(work)
        _portable_tokenizer_class(work / "tokenizer_config.json")
        (work / MARKER).write_text(json.dumps(marker_payload(params), indent=2) + "\n")
        # mkdtemp makes 0700 and safetensors may write 0600; the engine may run as another user.
        work.chmod(0o755)
        for f in work.iterdir():
            f.chmod(0o644)
        # Swap in whole: a half-written folder never looks complete.
        if out.exists():
            shutil.rmtree(out)
        os.replace(work, out)
    finally:
        if work.exists():
            shutil.rmtree(work)
    return True


def digest(out: Path) -> str:
    """SHA-256 over the weights file, to compare builds."""
    return hashlib.sha256((out / "model.safetensors").read_bytes()).hexdigest()


def main(args: list[str] | None = None) -> int:
    """CLI: build the tiny model into --out (idempotent) and say what happened."""
    out, params = parse_args(args)
    built = build(out, params)
    state = "built" if built else "already complete"
    print(f"tiny model {state}: {out.resolve()} sha256={digest(out)[:16]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
