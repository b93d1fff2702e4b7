"""`sdbench e2e` as a library call: options in, measured rows out (no rendering here).

    result = run_e2e(E2EOptions(target="ckpt/target", draft="ckpt/draft", verify_impls=("ballot", "naive")))
    result.rows  # one dict per (method, impl), keys = sdbench.e2e.results.SCHEMA

For every verification implementation: one speculative run on the same prompts with a generator
seeded by `seed` (after an unmeasured warm-up run when `warmup`), then the peers: the target alone
on the same batch, and HuggingFace assisted generation (`generate(assistant_model=...)`, batch 1).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from sdbench.e2e import builtin, models, results
from sdbench.e2e.speculative import Generation, speculative_generate, target_generate
from sdbench.e2e.verifier import SdbenchError, make_verifier, operation, unavailable_reason

DEFAULT_PROMPTS = (
    "def fibonacci(n):\n",
    "import os\nimport sys\n\n\ndef main(",
    "class Stack:\n    def __init__(self):\n",
    "    for index, value in enumerate(",
    "# Copyright",
    "if __name__ == '__main__':\n",
    "    raise ValueError(",
    "def read_config(path):\n    with open(",
)


@dataclass
class E2EOptions:
    """The flags of `sdbench e2e` (names match: --verify-impl, --gamma, --batch-size ...)."""

    target: str | None = None  # local checkpoint directory; None with draft None: the built-in pair
    draft: str | None = None
    verify_impls: tuple[str, ...] = ("torch_eager",)
    gamma: int = 4
    batch_size: int = 8
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0: greedy (`verify` impls); > 0: sampling (`prob_verify` impls)
    prompts: tuple[str, ...] | None = None  # text prompts, cycled to batch_size (needs a tokenizer)
    prompt_token_ids: tuple[tuple[int, ...], ...] | None = None  # library only: prompts as token ids
    sort_by_acceptance: bool = False
    acceptance_ema_decay: float = 0.9
    seed: int = 0
    device: str = "auto"  # auto: cuda when available
    dtype: str = "float32"
    attn_implementation: str = "sdpa"
    peers: bool = True  # the target alone
    hf_assisted: bool = True  # HuggingFace assisted generation, batch 1
    warmup: bool = True
    out: str | None = None  # parquet path
    trace_out: str | None = None  # accepted lengths of every round (first verify impl)
    builtin_steps: int | None = None  # training budget of the built-in pair (None: the recipe's)
    builtin_recipe: builtin.PairRecipe = field(default_factory=builtin.PairRecipe)
    progress: Callable[[str, int, int], None] | None = None  # built-in training progress (the CLI's bar)


@dataclass
class E2EResult:
    rows: list[dict]
    outputs: dict[str, list[list[int]]]  # method or impl -> new tokens per sequence
    accepted_lengths: list[list[int]]  # per round, of the first verify impl
    pair_metrics: dict | None  # the built-in pair's held-out losses and greedy acceptance
    parquet_path: Path | None = None
    trace_path: Path | None = None


def validate(options: E2EOptions) -> None:
    if options.gamma < 1:
        raise SdbenchError(f"--gamma must be >= 1, got {options.gamma}")
    if options.batch_size < 1:
        raise SdbenchError(f"--batch-size must be >= 1, got {options.batch_size}")
    if options.max_new_tokens < 1:
        raise SdbenchError(f"--max-new-tokens must be >= 1, got {options.max_new_tokens}")
    if options.temperature < 0:
        raise SdbenchError(f"--temperature must be >= 0 (0: greedy), got {options.temperature}")
    if not options.verify_impls:
        raise SdbenchError("give at least one --verify-impl")
    if (options.target is None) != (options.draft is None):
        raise SdbenchError("give both --target and --draft, or neither (the built-in pair)")
    if not 0.0 <= options.acceptance_ema_decay < 1.0:
        raise SdbenchError(f"the acceptance EMA decay must be in [0, 1), got {options.acceptance_ema_decay}")


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SdbenchError("--device cuda asked for but no CUDA device is visible (use --device cpu)")
    return device


def load(options: E2EOptions, device: torch.device) -> tuple[models.ModelPair, dict | None]:
    if options.target is not None:
        return models.load_pair(options.target, options.draft, device, options.dtype, options.attn_implementation), None
    recipe = options.builtin_recipe
    if options.builtin_steps is not None:
        recipe = dataclasses.replace(recipe, train_steps=options.builtin_steps)
    pair = builtin.ensure_builtin_pair(recipe, device, options.progress)
    loaded = models.load_pair(pair.target_dir, pair.draft_dir, device, options.dtype, options.attn_implementation)
    loaded.target_name, loaded.draft_name = f"builtin-{recipe.digest()}/target", f"builtin-{recipe.digest()}/draft"
    return loaded, pair.metrics


def prompt_ids(options: E2EOptions, pair: models.ModelPair, metrics: dict | None) -> list[list[int]]:
    if options.prompt_token_ids is not None:
        prompts = [list(p) for p in options.prompt_token_ids]
    else:
        texts = list(options.prompts or (metrics or {}).get("held_out_prompts") or DEFAULT_PROMPTS)
        if pair.tokenizer is None:
            raise SdbenchError("the target directory has no tokenizer, so text prompts cannot be encoded: save one "
                               "next to the target (tokenizer.save_pretrained) or pass prompt_token_ids")
        prompts = [pair.tokenizer(text)["input_ids"] for text in texts]
    if not prompts or any(len(p) == 0 for p in prompts):
        raise SdbenchError("every prompt needs at least one token")
    # Keep each prompt's last tokens so prompt + new tokens + a round fit the position table.
    limit = getattr(pair.target.config, "max_position_embeddings", None)
    if limit is not None:
        keep = limit - options.max_new_tokens - options.gamma - 2
        if keep < 1:
            raise SdbenchError(f"the model has {limit} positions: lower --max-new-tokens below "
                               f"{limit - options.gamma - 2}")
        prompts = [p[-keep:] for p in prompts]
    vocab = pair.vocab_size
    bad = [t for p in prompts for t in p if not 0 <= t < vocab]
    if bad:
        raise SdbenchError(f"prompt token {bad[0]} is outside the vocabulary [0, {vocab})")
    return [prompts[i % len(prompts)] for i in range(options.batch_size)]


def _mean(values: list[float]) -> float:
    return statistics.fmean(values) if values else math.nan


def _base_row(options: E2EOptions, pair: models.ModelPair, device: torch.device, run_id: str) -> dict:
    import transformers

    return {
        "schema_version": results.SCHEMA_VERSION, "run_id": run_id, "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "target": pair.target_name, "draft": pair.draft_name,
        "target_parameters": models.parameter_count(pair.target), "draft_parameters": models.parameter_count(pair.draft),
        "dtype": options.dtype, "batch_size": options.batch_size, "gamma": options.gamma,
        "temperature": options.temperature, "max_new_tokens": options.max_new_tokens,
        "sort_by_acceptance": options.sort_by_acceptance, "seed": options.seed,
        "torch_version": torch.__version__, "transformers_version": transformers.__version__,
    }


def generation_row(base: dict, method: str, impl: str, generation: Generation, batch: int, gamma: int,
                   reference_tokens: list[list[int]] | None) -> dict:
    lengths = [k for row in generation.accepted_lengths for k in row]
    phases = generation.phase_us
    # The first round holds one-off costs (lazy cache allocation, kernel selection): left out of the means.
    steady = {name: values[1:] if len(values) > 1 else values for name, values in phases.items()}
    step = [sum(values) for values in zip(*steady.values(), strict=True)] if steady else []
    emitted = generation.emitted_tokens
    return {
        **base, "method": method, "verify_impl": impl,
        "operation": operation(base["temperature"]) if method == "speculative" else "",
        "timer": generation.timer if phases else "",
        "rounds": generation.rounds, "emitted_tokens": emitted, "wall_s": generation.wall_s,
        "tokens_per_s": emitted / generation.wall_s if generation.wall_s > 0 else math.nan,
        # the batched forward counted once per sequence in it: the batch pays for its slowest sequence
        "target_forwards_per_token": generation.rounds * batch / emitted if emitted else math.nan,
        "mean_accepted_length": _mean(lengths),
        "acceptance_rate": _mean(lengths) / gamma if lengths else math.nan,
        "draft_us": _mean(steady.get("draft", [])), "target_us": _mean(steady.get("target", [])),
        "verify_us": _mean(steady.get("verify", [])), "bookkeeping_us": _mean(steady.get("bookkeeping", [])),
        "step_us": _mean(step),
        "matches_target": None if reference_tokens is None else generation.tokens == reference_tokens,
    }


def _generator(device: torch.device, seed: int) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(seed)


def run_speculative(options: E2EOptions, pair: models.ModelPair, prompts: list[list[int]], impl: str,
                    device: torch.device) -> Generation:
    verifier = make_verifier(impl, options.temperature, len(prompts), options.gamma, pair.vocab_size, device)

    def generate(max_new_tokens: int) -> Generation:
        return speculative_generate(
            pair.target, pair.draft, prompts, gamma=options.gamma, max_new_tokens=max_new_tokens, verifier=verifier,
            temperature=options.temperature, generator=_generator(device, options.seed),
            eos_token_id=pair.eos_token_id, pad_token_id=pair.pad_token_id,
            sort_by_acceptance=options.sort_by_acceptance, acceptance_ema_decay=options.acceptance_ema_decay)

    if options.warmup:
        generate(min(options.max_new_tokens, 2 * (options.gamma + 1)))
    return generate(options.max_new_tokens)


def run_target_only(options: E2EOptions, pair: models.ModelPair, prompts: list[list[int]],
                    device: torch.device) -> Generation:
    def generate(max_new_tokens: int) -> Generation:
        return target_generate(pair.target, prompts, max_new_tokens=max_new_tokens, temperature=options.temperature,
                               generator=_generator(device, options.seed), eos_token_id=pair.eos_token_id,
                               pad_token_id=pair.pad_token_id)

    if options.warmup:
        generate(min(options.max_new_tokens, 4))
    return generate(options.max_new_tokens)


def run_hf_assisted(options: E2EOptions, pair: models.ModelPair, prompts: list[list[int]],
                    device: torch.device) -> Generation:
    """transformers' own assisted generation, one prompt at a time (it supports batch 1 only)."""
    tokens, wall_s = [], 0.0
    for index, prompt in enumerate(prompts):
        torch.manual_seed(options.seed + index)
        input_ids = torch.tensor([prompt], device=device)
        sampling = options.temperature > 0
        extra = {"temperature": options.temperature} if sampling else {}
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        with torch.inference_mode():
            out = pair.target.generate(
                input_ids, attention_mask=torch.ones_like(input_ids), assistant_model=pair.draft,
                max_new_tokens=options.max_new_tokens, min_new_tokens=0, do_sample=sampling,
                num_assistant_tokens=options.gamma, num_assistant_tokens_schedule="constant",
                pad_token_id=pair.pad_token_id, eos_token_id=pair.eos_token_id, **extra)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        wall_s += time.perf_counter() - started
        tokens.append(out[0, len(prompt):].tolist())
    return Generation(tokens=tokens, rounds=0, wall_s=wall_s)


def run_e2e(options: E2EOptions) -> E2EResult:
    """Load (or train) the pair, run every verify impl and the peers, write parquet and the trace."""
    validate(options)
    device = resolve_device(options.device)
    for impl in options.verify_impls:
        reason = unavailable_reason(impl, options.temperature, device)
        if reason is not None:
            raise SdbenchError(f"--verify-impl {impl} cannot run on {device}: {reason}")
    pair, metrics = load(options, device)
    prompts = prompt_ids(options, pair, metrics)
    base = _base_row(options, pair, device, uuid.uuid4().hex[:12])
    rows, outputs = [], {}
    reference = None
    if options.peers:
        alone = run_target_only(options, pair, prompts, device)
        outputs["target_only"] = alone.tokens
        reference = alone.tokens if options.temperature <= 0 else None
        rows.append(generation_row(base, "target_only", "", alone, len(prompts), options.gamma, None))
    trace: list[list[int]] = []
    for impl in options.verify_impls:
        generation = run_speculative(options, pair, prompts, impl, device)
        outputs[impl] = generation.tokens
        trace = trace or generation.accepted_lengths
        rows.append(generation_row(base, "speculative", impl, generation, len(prompts), options.gamma, reference))
    if options.hf_assisted:
        assisted = run_hf_assisted(options, pair, prompts, device)
        outputs["hf_assisted"] = assisted.tokens
        rows.append(generation_row(base, "hf_assisted", "", assisted, len(prompts), options.gamma, None))
        rows[-1]["target_forwards_per_token"] = math.nan  # not observable from generate()
    result = E2EResult(rows=rows, outputs=outputs, accepted_lengths=trace, pair_metrics=metrics)
    if options.out is not None:
        result.parquet_path = results.write_rows(rows, options.out)
    if options.trace_out is not None:
        result.trace_path = results.write_trace(trace, options.trace_out)
    return result
