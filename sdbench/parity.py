"""Parity: every implementation against the reference, bit-exact for integers and packed KV.

`check(impl, workload)` is the single comparison used by `sdbench parity`, the sweep (before timing
a config) and the GPU tests. Outputs are poisoned before the run: buffers an implementation owns are
filled with garbage by `poison` (bools with the negation of the expected answer, so a kernel that
never writes one always fails), and an implementation that leaves a slot unwritten fails.

error_flags (sdbench.ops.input_contract) is an output like any other: a flag where the reference
flags bad input is expected, any other flag (or a missing one) is a failure. Peers that do not check
their input (FlashInfer, vLLM's design) may leave it out.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from sdbench.errors import SdbenchError, closest
from sdbench.ops import make_workload
from sdbench.ops.input_contract import ERROR_FLAGS
from sdbench.ops.pack import reference as pack_reference
from sdbench.ops.prob_verify import reference
from sdbench.ops.verify import reference as verify_reference
from sdbench.ops.verify_pack import reference as verify_pack_reference
from sdbench.ops.workload import DRAFT_LENGTH_DISTRIBUTIONS, VerifyConfig, VerifyWorkload
from sdbench.registry import Implementation, Outputs

# Values no correct kernel writes: negative lengths, a token outside any vocabulary, NaN-free KV
# garbage with a recognisable bit pattern.
POISON_INT = -7777
POISON_KV = -12345.0

MAX_INPUT_BYTES = 512 * 2**20  # configs whose inputs would exceed this are skipped (and counted)
PROB_OPS = ("prob_verify", "prob_verify_logits", "prob_verify_ragged")  # the prob grid (logits in place of p, q)


def poison(outputs: Outputs, expected: Outputs | None = None) -> None:
    """Fill every output buffer with values that no correct implementation produces: bools with the
    negation of their expected value where expected has it (else random bits)."""
    expected = expected or {}
    for name, tensor in outputs.items():
        if tensor.dtype == torch.bool:
            want = expected.get(name)
            if want is not None and want.shape == tensor.shape:
                tensor.copy_(~want.to(tensor.device))
            else:
                tensor.copy_(torch.randint(0, 2, tensor.shape, device=tensor.device, dtype=torch.bool))
        elif tensor.is_floating_point():
            tensor.fill_(POISON_KV)
        else:
            tensor.fill_(POISON_INT)


def expected_outputs(op: str, workload: VerifyWorkload) -> Outputs:
    """The reference answer for op on workload.

    Greedy ops are exact. prob_verify (a ProbWorkload in supplied randomness) is exact in its tokens
    and lengths; its float intermediates (reference.PROB_FLOAT_INTERMEDIATES) are optional outputs
    compared within an absolute tolerance, carried on the returned dict as `float_atol`.
    """
    w = workload
    if op == "prob_verify_logits":  # its own reference (temperature softmax, then the rule)
        from sdbench.ops.prob_verify_logits.reference import reference_outputs

        return reference_outputs(w)
    if op == "prob_verify":
        if w.randomness != "supplied":
            raise ValueError("prob_verify parity needs supplied randomness: fast-mode draws have no reference")
        outputs = reference.prob_verify(
            w.draft_tokens, w.target_probs, w.draft_probs, w.uniforms, w.exponential_noise,
            logprobs=w.config.logprobs, intermediates=True,
        )
        atol = reference.PROB_FLOAT_ATOL[w.config.prob_dtype]
        return reference.ToleratedOutputs(outputs, {name: atol for name in reference.PROB_FLOAT_INTERMEDIATES})
    if op == "prob_verify_ragged":
        if w.randomness != "supplied":
            raise ValueError("prob_verify_ragged parity needs supplied randomness: fast-mode draws have no reference")
        from sdbench.ops.prob_verify_ragged.reference import prob_verify_ragged

        return prob_verify_ragged(w.draft_tokens, w.target_probs, w.draft_probs, w.cu_num_draft_tokens, w.uniforms,
                                  w.exponential_noise, logprobs=w.config.logprobs)
    if op == "verify":
        return verify_reference.verify(w.draft_tokens, w.target_tokens)
    if op == "pack":
        return pack_reference.pack(w.draft_kv, w.accepted_lengths)
    if op == "verify_pack":
        return verify_pack_reference.verify_pack(w.draft_tokens, w.target_tokens, w.draft_kv)
    if op == "verify_ragged":
        from sdbench.ops.verify_ragged.reference import verify_ragged

        return verify_ragged(w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens)
    if op == "verify_pack_ragged":
        from sdbench.ops.verify_pack_ragged.reference import verify_pack_ragged

        return verify_pack_ragged(w.draft_tokens, w.target_tokens, w.cu_num_draft_tokens, w.draft_kv)
    raise ValueError(f"no greedy reference for operation {op!r}")


def compare(expected: Outputs, actual: Outputs, optional: tuple[str, ...] = ()) -> str | None:
    """None when actual equals expected bit for bit; else a one-line description of the first diff.

    packed_kv is compared on its first sum(k_i) rows: kernels write into a preallocated [B·γ, kv_dim]
    buffer whose tail is unspecified. Names in `expected.float_atol` (prob_verify's float
    intermediates) may be absent from actual; present, they must be within that absolute tolerance
    (a kernel may round differently from PyTorch, e.g. an approximate division or exp). Names in
    optional may be absent too (compared when present).
    """
    float_atol = getattr(expected, "float_atol", {})
    for name, want in expected.items():
        if name not in actual:
            if name in float_atol or name in optional:
                continue
            return f"{name}: missing from the outputs"
        got = actual[name]
        if name == "packed_kv":
            got = got[: want.shape[0]]
        if got.shape != want.shape:
            return f"{name}: shape {tuple(got.shape)} != expected {tuple(want.shape)}"
        if got.dtype != want.dtype:
            return f"{name}: dtype {got.dtype} != expected {want.dtype}"
        if name in float_atol:
            error = (got.double() - want.double()).abs().nan_to_num(nan=float("inf"))
            if bool((error > float_atol[name]).any()):
                index = tuple(int(i) for i in torch.nonzero(error > float_atol[name])[0])
                return (
                    f"{name}: max |error| {float(error.max()):.3g} > atol {float_atol[name]:g}; first at "
                    f"{list(index)}: got {got[index].item()}, expected {want[index].item()}"
                )
            continue
        got_bits, want_bits = _as_bits(got), _as_bits(want)
        differs = got_bits != want_bits
        if bool(differs.any()):
            index = tuple(int(i) for i in torch.nonzero(differs)[0])
            count = int(differs.sum())
            return (
                f"{name}: {count} of {want.numel()} elements differ; first at {list(index)}: "
                f"got {got[index].item()}, expected {want[index].item()}"
            )
    return None


def _as_bits(tensor: torch.Tensor) -> torch.Tensor:
    """Compare floats by bit pattern (bit-exact, NaN-safe), other dtypes as they are."""
    if tensor.dtype in (torch.float16, torch.bfloat16):
        return tensor.contiguous().view(torch.int16)
    if tensor.dtype == torch.float32:
        return tensor.contiguous().view(torch.int32)
    return tensor


def check(impl: Implementation, workload: VerifyWorkload) -> str | None:
    """Run impl once on workload (outputs poisoned first) and compare with the reference."""
    expected = expected_outputs(impl.op, workload)
    run = impl.prepare(workload)
    buffers = getattr(run, "outputs", None)  # prepared runs that own buffers expose them for poisoning
    if buffers is not None:
        poison(buffers, expected)
    actual = run()
    return compare(expected, actual, optional=(ERROR_FLAGS,) if impl.peer else ())


# --- grids -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ParityGrid:
    batch_sizes: tuple[int, ...] = (1, 4, 16, 32, 33, 256, 4096)
    gammas: tuple[int, ...] = (1, 3, 8, 31, 32, 33, 64, 128, 1024)
    alphas: tuple[float, ...] = (0.0, 0.3, 0.6, 0.9, 1.0)
    kv_dims: tuple[int, ...] = (8, 120, 128, 2048)
    dists: tuple[str, ...] = ("binomial", "geometric")
    token_dtypes: tuple[str, ...] = ("int64", "int32")
    kv_dtypes: tuple[str, ...] = ("float16", "bfloat16")
    # prob_verify reads B·(2γ+1)·V probabilities, so it has its own, smaller batch and γ lists.
    prob_batch_sizes: tuple[int, ...] = (1, 8, 32, 128)
    prob_gammas: tuple[int, ...] = (1, 4, 8, 16)
    vocab_sizes: tuple[int, ...] = (32000, 128256, 152064)
    prob_dtypes: tuple[str, ...] = ("float32", "bfloat16")
    logprobs: tuple[bool, ...] = (False, True)


QUICK_GRID = ParityGrid(
    batch_sizes=(1, 33, 256),
    gammas=(1, 31, 33, 128),
    alphas=(0.0, 0.6, 1.0),
    kv_dims=(8, 120),
    dists=("geometric",),
    token_dtypes=("int64", "int32"),
    kv_dtypes=("float16",),
    prob_batch_sizes=(1, 33),
    prob_gammas=(1, 8),
    vocab_sizes=(32000,),
    prob_dtypes=("float32", "bfloat16"),
    logprobs=(False, True),
)

# `TRITON_INTERPRET=1 sdbench parity --quick` on a CPU runs every Triton kernel in the interpreter
# (~10-30 ms per program, and prob_verify sweeps V per program): the quick grid at V=32000 took over
# 11 minutes on 2 cores. This one keeps every code path (splits, padding, γ=1, both dtypes, log-probs,
# all-accepted and all-rejected rows) at interpreter sizes, for about a minute on such a machine.
INTERPRETER_QUICK_GRID = ParityGrid(
    batch_sizes=(1, 33),
    gammas=(1, 31),
    alphas=(0.0, 0.6, 1.0),
    kv_dims=(8,),
    dists=("geometric",),
    token_dtypes=("int64", "int32"),
    kv_dtypes=("float16",),
    prob_batch_sizes=(1, 5),
    prob_gammas=(1, 4),
    vocab_sizes=(300,),
    prob_dtypes=("float32", "bfloat16"),
    logprobs=(False, True),
)


def quick_grid(device: str | torch.device) -> ParityGrid:
    """`--quick`'s grid: the interpreter-sized one where Triton runs interpreted on the CPU."""
    from sdbench.ops import backends  # read at call time: tests switch the interpreter flag

    if torch.device(device).type == "cpu" and backends.TRITON_INTERPRETED:
        return INTERPRETER_QUICK_GRID
    return QUICK_GRID


@dataclass(frozen=True)
class ParityPlan:
    """What `sdbench parity` runs: validated implementations, grid and device."""

    impls: list[Implementation]
    grid: ParityGrid
    device: str

    @property
    def total_configs(self) -> int:
        return sum(count_configs(op, self.grid) for op in {impl.op for impl in self.impls})


def plan(op: str | None = None, impl_names: list[str] | None = None, quick: bool = False, device: str | None = None,
         **overrides: tuple | list | None) -> ParityPlan:
    """Validate the parity command's choices (operation, names, device, grid overrides) at the library's edge.

    quick on a CPU device with Triton interpreted picks INTERPRETER_QUICK_GRID; overrides (batch_sizes,
    gammas, alphas, kv_dims) replace the grid's lists.
    """
    from sdbench import registry
    from sdbench.ops import OPERATIONS
    from sdbench.ops.backends import validate_device

    device = validate_device(device)
    grid = quick_grid(device) if quick else ParityGrid()
    grid = dataclasses.replace(grid, **{name: tuple(values) for name, values in overrides.items() if values})
    if op is not None and op not in OPERATIONS:
        registry.get(op, "torch_eager")  # an unknown operation: one line with a suggestion
    impls = [impl for o in ([op] if op else OPERATIONS) for impl in registry.implementations(o)]
    known = sorted({impl.name for impl in impls})
    for name in impl_names or []:
        if name not in known:
            raise SdbenchError(f"unknown implementation {name!r}{closest(name, known)}; see `sdbench list`")
    impls = [impl for impl in impls if not impl_names or impl.name in impl_names]
    return ParityPlan(impls, grid, device)


def input_bytes(op: str, cfg: VerifyConfig) -> int:
    """The largest input a config needs: the draft KV, or prob_verify's p, q and noise."""
    if op not in PROB_OPS:
        return cfg.kv_bytes
    elem = 4 if cfg.prob_dtype == "float32" else 2
    return cfg.batch_size * cfg.vocab_size * ((2 * cfg.gamma + 1) * elem + 4)


def configs_for(op: str, grid: ParityGrid, seed: int = 0) -> Iterator[VerifyConfig]:
    """Every config of grid that op needs (verify and verify_ragged ignore KV widths and KV dtypes)."""
    if op in PROB_OPS:  # prob_verify_logits: batch, γ, V, dtype of the prob grid
        yield from _prob_configs(grid, seed, ragged=op == "prob_verify_ragged")
        return
    no_kv = op in ("verify", "verify_ragged")
    kv_dims = (0,) if no_kv else grid.kv_dims
    kv_dtypes = ("float16",) if no_kv else grid.kv_dtypes
    token_dtypes = grid.token_dtypes if op != "pack" else ("int64",)
    points = itertools.product(
        grid.batch_sizes, grid.gammas, grid.alphas, kv_dims, grid.dists, token_dtypes, kv_dtypes
    )
    for index, (batch, gamma, alpha, kv_dim, dist, token_dtype, kv_dtype) in enumerate(points):
        yield VerifyConfig(
            batch_size=batch, gamma=gamma, alpha=alpha, kv_dim=kv_dim, dist=dist,
            token_dtype=token_dtype, kv_dtype=kv_dtype, seed=seed + index,
        )


def _prob_configs(grid: ParityGrid, seed: int, ragged: bool = False) -> Iterator[VerifyConfig]:
    """The prob grid; ragged cycles the γ_i distributions through it (γ_i = 0 and mixed lengths from
    `uniform`, every request at γ_max from `full`, γ_max beside 1 from `bimodal`)."""
    points = itertools.product(
        grid.prob_batch_sizes, grid.prob_gammas, grid.alphas, grid.vocab_sizes, grid.prob_dtypes, grid.logprobs
    )
    for index, (batch, gamma, alpha, vocab, prob_dtype, logprobs) in enumerate(points):
        draft_lengths = DRAFT_LENGTH_DISTRIBUTIONS[index % len(DRAFT_LENGTH_DISTRIBUTIONS)] if ragged else "uniform"
        yield VerifyConfig(
            batch_size=batch, gamma=gamma, alpha=alpha, vocab_size=vocab, prob_dtype=prob_dtype,
            logprobs=logprobs, seed=seed + index, draft_lengths=draft_lengths,
        )


@dataclass
class ParityTally:
    passed: int = 0
    failed: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> count
    first_failure: str | None = None

    def skip(self, reason: str) -> None:
        self.skipped[reason] = self.skipped.get(reason, 0) + 1


def run_parity(
    impls: list[Implementation], grid: ParityGrid, device: str, seed: int = 0, progress=None
) -> dict[tuple[str, str], ParityTally]:
    """Check every impl on every config of grid; one workload per config serves all of its impls."""
    tallies = {impl.key: ParityTally() for impl in impls}
    ops = sorted({impl.op for impl in impls})
    for op in ops:
        op_impls = [impl for impl in impls if impl.op == op]
        for cfg in configs_for(op, grid, seed):
            if input_bytes(op, cfg) > MAX_INPUT_BYTES:
                for impl in op_impls:
                    tallies[impl.key].skip("inputs over 512 MiB")
                if progress:
                    progress()
                continue
            runnable = []
            for impl in op_impls:
                reason = impl.unavailable_reason(device, cfg)
                if reason is None:
                    runnable.append(impl)
                else:
                    tallies[impl.key].skip(reason)
            if runnable:
                workload = make_workload(op, cfg, device)
                for impl in runnable:
                    _check_into(tallies[impl.key], impl, workload)
            if progress:
                progress()
    return tallies


def _check_into(tally: ParityTally, impl: Implementation, workload: VerifyWorkload) -> None:
    try:
        failure = check(impl, workload)
    except Exception as err:  # a crashing kernel is a failed case, not a crashed run
        failure = f"raised {type(err).__name__}: {err}"
    if failure is None:
        tally.passed += 1
        return
    tally.failed += 1
    if tally.first_failure is None:
        tally.first_failure = f"{workload.config}: {failure}"


def count_configs(op: str, grid: ParityGrid) -> int:
    return sum(1 for _ in configs_for(op, grid))
