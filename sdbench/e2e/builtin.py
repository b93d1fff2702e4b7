"""A built-in draft/target pair for machines with no checkpoints, trained locally and cached.

Corpus: the Python standard library's own .py files (every machine that runs sdbench has them), in
sorted order, capped at `max_corpus_bytes`; every `held_out_every`-th file is held out. Tokenizer:
tokenizers' ByteLevel BPE trainer. Models: GPT-2 architecture, a ~14 M parameter target and a ~1.4 M
draft at the default recipe, trained as plain language models on the same token stream.

The pair lives in ~/.cache/sdbench/builtin-pair-<hash of the recipe> (or $SDBENCH_CACHE) and is trained
only when that directory is missing; a run builds it in a temporary sibling and renames it into place,
so an interrupted training never leaves a half-written pair. Seeded (torch, window sampling); on a GPU
the result is not bitwise reproducible (atomic-add backward kernels), which is why the cache is keyed
by the recipe, not by the weights.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import sysconfig
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

Progress = Callable[[str, int, int], None]  # (what, completed, total)
EOS = "<|endoftext|>"


@dataclass(frozen=True)
class LMShape:
    n_layer: int
    n_embd: int
    n_head: int


@dataclass(frozen=True)
class PairRecipe:
    """Everything that determines the pair; its hash names the cache directory."""

    vocab_size: int = 8192
    context: int = 256
    target: LMShape = LMShape(n_layer=6, n_embd=384, n_head=6)
    draft: LMShape = LMShape(n_layer=2, n_embd=128, n_head=2)
    train_steps: int = 1500  # per model: the training budget
    batch_size: int = 32
    learning_rate: float = 1e-3
    max_corpus_bytes: int = 16_000_000
    held_out_every: int = 20
    seed: int = 0

    def digest(self) -> str:
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:12]


@dataclass
class BuiltinPair:
    path: Path
    metrics: dict  # held-out losses, parameter counts, greedy acceptance, the recipe
    trained_now: bool

    @property
    def target_dir(self) -> Path:
        return self.path / "target"

    @property
    def draft_dir(self) -> Path:
        return self.path / "draft"


def cache_root() -> Path:
    return Path(os.environ.get("SDBENCH_CACHE", Path.home() / ".cache" / "sdbench"))


def pair_dir(recipe: PairRecipe, root: Path | None = None) -> Path:
    return (root or cache_root()) / f"builtin-pair-{recipe.digest()}"


def stdlib_corpus(max_bytes: int, held_out_every: int) -> tuple[list[str], list[str]]:
    """(training texts, held-out texts): sorted stdlib .py files up to max_bytes in all."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    train, held_out, total = [], [], 0
    files = sorted(p for p in stdlib.rglob("*.py") if "site-packages" not in p.parts)
    for index, path in enumerate(files):
        text = path.read_text(encoding="utf-8", errors="replace")
        if total + len(text) > max_bytes:
            break
        total += len(text)
        (held_out if index % held_out_every == 0 else train).append(text)
    return train, held_out


def train_tokenizer(texts: list[str], vocab_size: int):
    """A ByteLevel BPE tokenizer wrapped as a transformers fast tokenizer (EOS = <|endoftext|>)."""
    from tokenizers import ByteLevelBPETokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=vocab_size, min_frequency=2, special_tokens=[EOS], show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS, bos_token=EOS, pad_token=EOS)


def _token_stream(tokenizer, texts: list[str]) -> torch.Tensor:
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for encoded in tokenizer(texts)["input_ids"]:
        ids.extend(encoded)
        ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def _gpt2(shape: LMShape, recipe: PairRecipe, tokenizer):
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=len(tokenizer), n_positions=recipe.context * 4, n_layer=shape.n_layer,
                        n_embd=shape.n_embd, n_head=shape.n_head, bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id)
    return GPT2LMHeadModel(config)


def _windows(stream: torch.Tensor, count: int, context: int, generator: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, max(1, stream.numel() - context - 1), (count,), generator=generator)
    return torch.stack([stream[s: s + context + 1] for s in starts.tolist()])


def train_lm(shape: LMShape, recipe: PairRecipe, tokenizer, train_ids: torch.Tensor, held_out_ids: torch.Tensor,
             device: torch.device, progress: Progress | None, role: str):
    """One GPT-2 trained for recipe.train_steps; returns (model in eval mode, held-out loss in nats)."""
    torch.manual_seed(recipe.seed)
    model = _gpt2(shape, recipe, tokenizer).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.learning_rate, weight_decay=0.01)
    warmup = max(1, recipe.train_steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: min(1.0, (step + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, step / recipe.train_steps))))
    generator = torch.Generator().manual_seed(recipe.seed)
    autocast = torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")
    for step in range(recipe.train_steps):
        batch = _windows(train_ids, recipe.batch_size, recipe.context, generator).to(device)
        with autocast:
            loss = model(input_ids=batch[:, :-1], labels=batch[:, :-1]).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        if progress is not None:
            progress(f"training the {role}", step + 1, recipe.train_steps)
    model.eval()
    return model, held_out_loss(model, held_out_ids, recipe.context, device)


@torch.no_grad()
def held_out_loss(model, held_out_ids: torch.Tensor, context: int, device: torch.device, windows: int = 64) -> float:
    """Mean next-token cross-entropy (nats) over fixed, seeded held-out windows."""
    batch = _windows(held_out_ids, windows, context, torch.Generator().manual_seed(1234)).to(device)
    return float(model(input_ids=batch, labels=batch).loss)


def ensure_builtin_pair(recipe: PairRecipe = PairRecipe(), device: torch.device | str = "cpu",
                        progress: Progress | None = None, root: Path | None = None) -> BuiltinPair:
    """The cached pair for recipe, training it first when its directory is missing."""
    final = pair_dir(recipe, root)
    if (final / "metrics.json").is_file():
        return BuiltinPair(path=final, metrics=json.loads((final / "metrics.json").read_text()), trained_now=False)
    device = torch.device(device)
    final.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix=final.name + ".tmp-", dir=final.parent))
    try:
        metrics = _train_pair(recipe, device, progress, building)
        (building / "metrics.json").write_text(json.dumps(metrics, indent=2, sort_keys=True))
        try:
            building.rename(final)
        except OSError:  # another process finished first: keep theirs
            shutil.rmtree(building, ignore_errors=True)
    except BaseException:
        shutil.rmtree(building, ignore_errors=True)
        raise
    return BuiltinPair(path=final, metrics=json.loads((final / "metrics.json").read_text()), trained_now=True)


def _train_pair(recipe: PairRecipe, device: torch.device, progress: Progress | None, out: Path) -> dict:
    train_texts, held_out_texts = stdlib_corpus(recipe.max_corpus_bytes, recipe.held_out_every)
    tokenizer = train_tokenizer(train_texts, recipe.vocab_size)
    train_ids, held_out_ids = _token_stream(tokenizer, train_texts), _token_stream(tokenizer, held_out_texts)
    target, target_loss = train_lm(recipe.target, recipe, tokenizer, train_ids, held_out_ids, device, progress, "target")
    draft, draft_loss = train_lm(recipe.draft, recipe, tokenizer, train_ids, held_out_ids, device, progress, "draft")
    for role, model in (("target", target), ("draft", draft)):
        model.save_pretrained(out / role)
        tokenizer.save_pretrained(out / role)
    held_out_prompts = [t[:200] for t in held_out_texts[:8]]
    return {
        "recipe": dataclasses.asdict(recipe),
        "recipe_digest": recipe.digest(),
        "target_held_out_loss": target_loss,
        "draft_held_out_loss": draft_loss,
        "target_parameters": sum(p.numel() for p in target.parameters()),
        "draft_parameters": sum(p.numel() for p in draft.parameters()),
        "train_tokens": int(train_ids.numel()),
        "held_out_tokens": int(held_out_ids.numel()),
        "trained_on": str(device),
        "greedy_acceptance_rate": greedy_acceptance_rate(target, draft, tokenizer, held_out_prompts),
        "held_out_prompts": held_out_prompts,
    }


def greedy_acceptance_rate(target, draft, tokenizer, prompts: list[str], gamma: int = 4,
                           max_new_tokens: int = 32) -> float:
    """Mean k_i / γ of greedy speculative decoding on held-out prompts."""
    from sdbench.e2e.speculative import speculative_generate
    from sdbench.e2e.verifier import make_verifier

    ids = [tokenizer(p)["input_ids"][-64:] or [tokenizer.eos_token_id] for p in prompts]
    device = target.device
    verifier = make_verifier("torch_eager", 0.0, len(ids), gamma, target.config.vocab_size, device)
    result = speculative_generate(target, draft, ids, gamma=gamma, max_new_tokens=max_new_tokens, verifier=verifier,
                                  eos_token_id=None, pad_token_id=tokenizer.eos_token_id)
    lengths = [k for row in result.accepted_lengths for k in row]
    return sum(lengths) / (gamma * len(lengths))
