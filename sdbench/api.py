"""The library API: `sdbench.verify`, `sdbench.pack`, `sdbench.verify_pack`, `sdbench.prob_verify`.

    out = sdbench.verify_pack(draft_tokens, target_tokens, draft_kv, impl="auto", expected_alpha=0.8)
    out["accepted_lengths"], out["packed_kv"][: ...], out["packed_offsets"], out["next_tokens"]

Inputs are validated here, at the edge, before any launch: shapes, dtypes, devices and contiguity, with
messages that name the bad value and the fix. Output buffers are the caller's (`out=`, any subset) or
allocated here; every implementation writes into them (CUDA kernels directly, through the launchers of
torch.ops.sdbench), so results never depend on which one ran:
- verify:      accepted_lengths int64 [B], has_mismatch bool [B], next_tokens [B] (token dtype)
- pack:        packed_kv [B·γ, kv_dim] (KV dtype; rows past Σ k_i are unspecified), packed_offsets int64 [B]
- verify_pack: all five.
Ragged draft lengths (`cu_num_draft_tokens=`, int64 [B]: the flattened layout serving engines use) route
`verify`, `verify_pack` and `prob_verify` to the registry's verify_ragged, verify_pack_ragged and
prob_verify_ragged: draft_tokens [T], target_tokens [T + B] (request i's drafts at [cu[i-1], cu[i]), its
targets at [cu[i-1] + i, cu[i] + i + 1)), draft_kv [T, kv_dim], packed_kv [T, kv_dim]. Only shapes are
checked: the offsets' values are never read on the host (that would sync); kernels clamp bad offsets so
nothing outside the inputs is read or written.
CPU tensors run the eager PyTorch reference (`torch_eager`) whatever impl is asked for, unless that
implementation runs on the CPU itself. Values are never checked here (that would read the device: a host
sync): bad values (accepted lengths outside [0, γ] given to `pack`) follow the input contract
(sdbench.ops.input_contract: clamped, flagged in `error_flags`), and `sdbench.check(outputs)` raises on
them at the caller's own sync point.

One rule each, for every function: batch and γ are >= 1 (an empty batch is an error, not a no-op);
`expected_alpha` is a real number in [0, 1] (not a bool); an `out=` buffer may not overlap an input or
another output (the kernels would race on it).

`impl="auto"` asks sdbench.dispatch, which decides from shapes and the expected acceptance: the caller's
`expected_alpha` (E[k] / γ), else the mean of the previous auto step on this device, read only once its
asynchronous copy has landed (no sync), else 1.0 (every draft accepted: the upper bound on bytes).
"""

from __future__ import annotations

import functools
import numbers

import torch

from sdbench import dispatch, registry
from sdbench.errors import SdbenchError
from sdbench.ops.prob_verify.reference import RULES
from sdbench.ops.workload import KV_DTYPES, TOKEN_DTYPES, VerifyConfig, VerifyWorkload

TOKEN_TORCH_DTYPES = tuple(TOKEN_DTYPES.values())
KV_TORCH_DTYPES = tuple(KV_DTYPES.values())
EAGER = "torch_eager"
DEFAULT_EXPECTED_ALPHA = 1.0  # before any step's mean is known: assume the most KV to copy

Outputs = dict[str, torch.Tensor]


# --- validation --------------------------------------------------------------------------------
def _shape(tensor: torch.Tensor) -> str:
    return "[" + ", ".join(str(size) for size in tensor.shape) + "]"


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _require_tensor(name: str, value) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise SdbenchError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def _check_tokens(draft_tokens, target_tokens) -> tuple[int, int]:
    draft = _require_tensor("draft_tokens", draft_tokens)
    target = _require_tensor("target_tokens", target_tokens)
    if draft.dim() != 2 or draft.shape[0] < 1 or draft.shape[1] < 1:
        raise SdbenchError(f"draft_tokens must be 2-D [batch, gamma] with both >= 1, got shape {_shape(draft)}")
    batch, gamma = draft.shape
    if tuple(target.shape) != (batch, gamma + 1):
        raise SdbenchError(
            f"target_tokens must be [batch, gamma + 1] = [{batch}, {gamma + 1}] for draft_tokens {_shape(draft)} "
            f"(the extra position holds the bonus token), got {_shape(target)}"
        )
    _check_token_pair(draft, target)
    return batch, gamma


def _check_token_pair(draft: torch.Tensor, target: torch.Tensor) -> None:
    if draft.dtype not in TOKEN_TORCH_DTYPES:
        raise SdbenchError(f"draft_tokens dtype {_dtype_name(draft.dtype)} is not a token dtype: use int64 or int32 "
                           "(e.g. draft_tokens.long())")
    if target.dtype != draft.dtype:
        raise SdbenchError(f"target_tokens dtype {_dtype_name(target.dtype)} differs from draft_tokens "
                           f"{_dtype_name(draft.dtype)}: convert one (e.g. target_tokens.to(draft_tokens.dtype))")
    if target.device != draft.device:
        raise SdbenchError(f"target_tokens is on {target.device} but draft_tokens on {draft.device}: move both to one device")


# --- the ragged layout (cu_num_draft_tokens=): shapes only, the offsets' values are never read (a sync) -----
def _check_offsets(cu_num_draft_tokens, device: torch.device) -> int:
    """The batch B of cu_num_draft_tokens (int64 [B], B >= 1, contiguous, on device)."""
    cu = _require_tensor("cu_num_draft_tokens", cu_num_draft_tokens)
    if cu.dim() != 1 or cu.shape[0] < 1:
        raise SdbenchError(f"cu_num_draft_tokens must be 1-D [batch] with batch >= 1 (the inclusive prefix sum of each "
                           f"request's draft count), got shape {_shape(cu)}")
    if cu.dtype != torch.int64:
        raise SdbenchError(f"cu_num_draft_tokens must be int64, got {_dtype_name(cu.dtype)}: use cu_num_draft_tokens.long()")
    if cu.device != device:
        raise SdbenchError(f"cu_num_draft_tokens is on {cu.device} but draft_tokens on {device}: move them to one device")
    if not cu.is_contiguous():
        raise SdbenchError("cu_num_draft_tokens must be contiguous (pass cu_num_draft_tokens.contiguous())")
    return cu.shape[0]


def _check_ragged_drafts(draft_tokens, cu_num_draft_tokens) -> tuple[int, int]:
    """(B, T): draft_tokens [T] (every request's drafts end to end, T >= 0) beside cu_num_draft_tokens [B]."""
    draft = _require_tensor("draft_tokens", draft_tokens)
    if draft.dim() != 1:
        raise SdbenchError(f"draft_tokens must be 1-D [T] (every request's drafts end to end) when cu_num_draft_tokens "
                           f"is given, got shape {_shape(draft)}")
    if draft.dtype not in TOKEN_TORCH_DTYPES:
        raise SdbenchError(f"draft_tokens dtype {_dtype_name(draft.dtype)} is not a token dtype: use int64 or int32")
    if not draft.is_contiguous():
        raise SdbenchError("draft_tokens must be contiguous (pass draft_tokens.contiguous())")
    return _check_offsets(cu_num_draft_tokens, draft.device), draft.shape[0]


def _check_ragged_tokens(draft_tokens, target_tokens, cu_num_draft_tokens) -> tuple[int, int]:
    batch, total = _check_ragged_drafts(draft_tokens, cu_num_draft_tokens)
    target = _require_tensor("target_tokens", target_tokens)
    if tuple(target.shape) != (total + batch,):
        raise SdbenchError(f"target_tokens must be [T + batch] = [{total + batch}] for draft_tokens [{total}] and "
                           f"{batch} requests (each request's γ_i + 1 targets, its bonus token last), got {_shape(target)}")
    _check_token_pair(draft_tokens, target)
    if not target.is_contiguous():
        raise SdbenchError("target_tokens must be contiguous (pass target_tokens.contiguous())")
    return batch, total


def _ragged_workload(batch: int, total: int, draft_tokens, target_tokens, cu_num_draft_tokens, draft_kv=None):
    """The registry's ragged workload over the caller's tensors. γ_max is T: an upper bound known from the
    shapes (the kernels size no result on it, only their scan width and grid, capped); the oracle fields
    are placeholders no implementation reads."""
    from sdbench.ops.verify_ragged.workload import RaggedVerifyWorkload

    unread = torch.empty(batch, dtype=torch.int64, device=draft_tokens.device)
    return RaggedVerifyWorkload(config=_config(batch, max(total, 1), draft_tokens.dtype, None), draft_tokens=draft_tokens,
                                target_tokens=target_tokens, cu_num_draft_tokens=cu_num_draft_tokens,
                                draft_lengths=unread, accepted_lengths=unread, draft_kv=draft_kv)


def _check_kv(draft_kv, batch: int | None, gamma: int | None, device: torch.device | None, allow_float32: bool) -> None:
    kv = _require_tensor("draft_kv", draft_kv)
    if kv.dim() != 3 or min(kv.shape) < 1:
        raise SdbenchError(f"draft_kv must be 3-D [batch, gamma, kv_dim] with all three >= 1, got shape {_shape(kv)}")
    if batch is not None and tuple(kv.shape[:2]) != (batch, gamma):
        raise SdbenchError(f"draft_kv must be [batch, gamma, kv_dim] = [{batch}, {gamma}, kv_dim] to match the tokens, "
                           f"got {_shape(kv)}")
    allowed = KV_TORCH_DTYPES + ((torch.float32,) if allow_float32 else ())
    if kv.dtype not in allowed:
        raise SdbenchError(f"draft_kv dtype {_dtype_name(kv.dtype)} is not supported here: use "
                           f"{' or '.join(_dtype_name(d) for d in allowed)} (e.g. draft_kv.half())")
    if device is not None and kv.device != device:
        raise SdbenchError(f"draft_kv is on {kv.device} but the tokens on {device}: move them to one device")


def _check_lengths(accepted_lengths, batch: int, device: torch.device) -> None:
    lengths = _require_tensor("accepted_lengths", accepted_lengths)
    if tuple(lengths.shape) != (batch,):
        raise SdbenchError(f"accepted_lengths must be 1-D [batch] = [{batch}], got {_shape(lengths)}")
    if lengths.dtype != torch.int64:
        raise SdbenchError(f"accepted_lengths must be int64 (as verify returns), got {_dtype_name(lengths.dtype)}: "
                           "use accepted_lengths.long()")
    if lengths.device != device:
        raise SdbenchError(f"accepted_lengths is on {lengths.device} but draft_kv on {device}: move them to one device")


def _check_contiguous(impl: str, **tensors: torch.Tensor) -> None:
    for name, tensor in tensors.items():
        if tensor is not None and not tensor.is_contiguous():
            raise SdbenchError(f"{name} must be contiguous for impl {impl!r} (pass {name}.contiguous())")


def _output_specs(batch: int, gamma: int, token_dtype: torch.dtype, kv_dim: int | None, kv_dtype: torch.dtype | None,
                  names: tuple[str, ...]) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
    specs = {
        "accepted_lengths": ((batch,), torch.int64),
        "has_mismatch": ((batch,), torch.bool),
        "next_tokens": ((batch,), token_dtype),
        "packed_kv": ((batch * gamma, kv_dim or 0), kv_dtype),
        "packed_offsets": ((batch,), torch.int64),
    }
    return {name: specs[name] for name in names}


VERIFY_OUTPUTS = ("accepted_lengths", "has_mismatch", "next_tokens")
PACK_OUTPUTS = ("packed_kv", "packed_offsets")


def _byte_range(tensor: torch.Tensor) -> tuple[int, int]:
    """[first, last) bytes a tensor's elements can touch (from its strides; never reads the device)."""
    if tensor.numel() == 0:
        return tensor.data_ptr(), tensor.data_ptr()
    low = high = tensor.data_ptr()
    for size, stride in zip(tensor.shape, tensor.stride(), strict=True):
        reach = (size - 1) * stride * tensor.element_size()
        low, high = (low + reach, high) if reach < 0 else (low, high + reach)
    return low, high + tensor.element_size()


def _check_no_overlap(buffers: Outputs, given: Outputs, inputs: dict[str, torch.Tensor | None]) -> None:
    """No caller buffer shares memory with an input or another output: the kernels would race on it."""
    others = {name: tensor for name, tensor in inputs.items() if tensor is not None}
    others.update({f"out[{name!r}]": buffers[name] for name in buffers})
    for name, tensor in given.items():
        if tensor is None or tensor.numel() == 0:
            continue
        first, last = _byte_range(tensor)
        for other_name, other in others.items():
            if other_name == f"out[{name!r}]" or other.device != tensor.device or other.numel() == 0:
                continue
            other_first, other_last = _byte_range(other)
            if first < other_last and other_first < last:
                raise SdbenchError(f"out[{name!r}] overlaps {other_name} in memory: outputs must not alias the inputs "
                                   "or each other (the kernels would race); pass a separate buffer")


def _outputs(out: Outputs | None, specs: dict, device: torch.device, inputs: dict | None = None) -> Outputs:
    """The caller's buffers, checked (also for overlap with the inputs and each other), plus fresh ones for
    any not given."""
    if out is not None and not isinstance(out, dict):
        raise SdbenchError(f"out must be a dict of output tensors keyed by {', '.join(specs)}, got {type(out).__name__}")
    given = dict(out or {})
    unknown = sorted(set(given) - set(specs))
    if unknown:
        raise SdbenchError(f"out has unknown keys {', '.join(unknown)}; outputs are {', '.join(specs)}")
    buffers = {}
    for name, (shape, dtype) in specs.items():
        tensor = given.get(name)
        if tensor is None:
            buffers[name] = torch.empty(shape, dtype=dtype, device=device)
            continue
        _require_tensor(f"out[{name!r}]", tensor)
        if tuple(tensor.shape) != shape or tensor.dtype != dtype or tensor.device != device:
            raise SdbenchError(
                f"out[{name!r}] must be {_dtype_name(dtype)} [{', '.join(map(str, shape))}] on {device}, got "
                f"{_dtype_name(tensor.dtype)} {_shape(tensor)} on {tensor.device} (or leave it out to allocate one)"
            )
        if not tensor.is_contiguous():
            raise SdbenchError(f"out[{name!r}] must be contiguous")
        buffers[name] = tensor
    _check_no_overlap(buffers, {name: given.get(name) for name in specs}, inputs or {})
    return buffers


# --- choosing and running an implementation ------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _resolve_cached(op: str, impl: str, device: torch.device) -> registry.Implementation:
    entry = registry.get(op, impl)
    if device.type not in entry.devices:
        if device.type == "cpu":
            return registry.get(op, EAGER)
        raise SdbenchError(f"impl {impl!r} runs on {'/'.join(entry.devices)} only; the tensors are on {device}")
    reason = entry.unavailable_reason(device)  # probes (a build on first use): once per process and device
    if reason is not None:
        raise SdbenchError(f"impl {impl!r} cannot run here: {reason} (try impl={EAGER!r})")
    return entry


def _resolve(op: str, impl: str, device: torch.device) -> registry.Implementation:
    """The registry entry to run: the eager reference for CPU tensors the entry cannot take."""
    return _resolve_cached(op, impl, device)


@functools.lru_cache(maxsize=1024)
def _shape_reason(op: str, impl: str, batch: int, gamma: int, kv_dim: int, token_dtype: str, kv_dtype: str) -> str | None:
    config = VerifyConfig(batch_size=batch, gamma=gamma, kv_dim=kv_dim, token_dtype=token_dtype, kv_dtype=kv_dtype)
    return registry.get(op, impl).supports(config)


def _check_supports(op: str, entry: registry.Implementation, batch: int, gamma: int, token_dtype: torch.dtype,
                    kv: torch.Tensor | None) -> None:
    """The implementation takes this shape (e.g. fused_single_block needs B <= 32); cached per shape."""
    if entry.name == EAGER:
        return
    config = _config(batch, gamma, token_dtype, kv)
    reason = _shape_reason(op, entry.name, batch, gamma, config.kv_dim, config.token_dtype, config.kv_dtype)
    if reason is not None:
        hint = "impl='auto'" if op == "verify_pack" else f"impl={EAGER!r}"
        raise SdbenchError(f"impl {entry.name!r} cannot run batch={batch}, gamma={gamma}"
                           f"{f', kv_dim={config.kv_dim}' if kv is not None else ''}: {reason} (try {hint})")


def _config(batch: int, gamma: int, token_dtype: torch.dtype, kv: torch.Tensor | None) -> VerifyConfig:
    token_name = next(name for name, dtype in TOKEN_DTYPES.items() if dtype == token_dtype)
    kv_name = "float16"
    if kv is not None:
        kv_name = next((name for name, dtype in KV_DTYPES.items() if dtype == kv.dtype), "float16")
    return VerifyConfig(batch_size=batch, gamma=gamma, kv_dim=0 if kv is None else kv.shape[2],
                        token_dtype=token_name, kv_dtype=kv_name)


def _copy_into(buffers: Outputs, results: Outputs) -> None:
    for name, buffer in buffers.items():
        value = results[name]
        if value is buffer:
            continue
        if name == "packed_kv" and value.shape[0] != buffer.shape[0]:
            buffer[: value.shape[0]].copy_(value)  # draft_kv[mask] returns exactly Σ k_i rows
        else:
            buffer.copy_(value)


def _run(op: str, entry: registry.Implementation, *, draft_tokens=None, target_tokens=None, draft_kv=None,
         accepted_lengths=None, buffers: Outputs) -> Outputs:
    """Launch entry once on the caller's tensors, through the registry: straight into buffers when the
    entry writes into given outputs, else run it and copy its outputs in (eager references, syncing peers)."""
    if draft_tokens is not None:
        batch, gamma = draft_tokens.shape
        token_dtype, device = draft_tokens.dtype, draft_tokens.device
    else:  # pack reads no tokens: zero-width views give the workload its batch and device at no cost
        batch, gamma = draft_kv.shape[:2]
        token_dtype, device = torch.int64, draft_kv.device
    no_tokens = torch.empty((batch, 0), dtype=token_dtype, device=device)
    workload = VerifyWorkload(
        config=_config(batch, gamma, token_dtype, draft_kv),
        draft_tokens=draft_tokens if draft_tokens is not None else no_tokens,
        target_tokens=target_tokens if target_tokens is not None else no_tokens,
        # verify implementations never read the oracle; pack reads the caller's lengths through it.
        accepted_lengths=accepted_lengths if accepted_lengths is not None else torch.empty(batch, dtype=torch.int64, device=device),
        draft_kv=draft_kv,
    )
    return _launch(entry, workload, buffers)


def _launch(entry: registry.Implementation, workload, buffers: Outputs) -> Outputs:
    if entry.writes_into:
        produced = entry.prepare(workload, out=buffers)()
    else:
        produced = entry.prepare(workload)()
        _copy_into(buffers, produced)
    # Outputs beyond the documented ones (error_flags: bad lengths or token ids, set on the device) are
    # passed through; sdbench.check(outputs) is the caller's explicit sync point that reads them.
    buffers.update({name: value for name, value in produced.items() if name not in buffers})
    return buffers


# --- the previous step's acceptance, without a sync ------------------------------------------------
class _PreviousMean:
    """Mean accepted fraction of the last auto step on one device, copied to pinned memory asynchronously.

    `alpha()` reads the copy only once its event has completed (event.query() never blocks), so the
    value may lag a step behind; that is what "the previous step's mean" can mean without a sync.
    """

    def __init__(self) -> None:
        self.pending: tuple[torch.Tensor, torch.cuda.Event, int] | None = None
        self.latest: float | None = None

    def alpha(self) -> float | None:
        if self.pending is not None and self.pending[1].query():
            host, _, gamma = self.pending
            self.latest = float(host.double().mean()) / gamma
            self.pending = None
        return self.latest

    def record(self, accepted_lengths: torch.Tensor, gamma: int) -> None:
        if torch.cuda.is_current_stream_capturing() or (self.pending is not None and not self.pending[1].query()):
            return  # never inside a graph capture; at most one copy in flight
        host = torch.empty(accepted_lengths.shape, dtype=accepted_lengths.dtype, pin_memory=True)
        host.copy_(accepted_lengths, non_blocking=True)
        event = torch.cuda.Event()
        event.record()
        self.pending = (host, event, gamma)


_previous: dict[str, _PreviousMean] = {}


def previous_step_alpha(device: torch.device | str) -> float | None:
    """The mean accepted fraction E[k]/γ of the last auto verify_pack on device, once it is known."""
    tracker = _previous.get(str(device))
    return tracker.alpha() if tracker is not None else None


# --- public API ------------------------------------------------------------------------------------
def verify(draft_tokens: torch.Tensor, target_tokens: torch.Tensor, *, impl: str = "ballot",
           out: Outputs | None = None, cu_num_draft_tokens: torch.Tensor | None = None) -> Outputs:
    """Greedy verification: accepted_lengths, has_mismatch, next_tokens (see the module docstring).

    cu_num_draft_tokens (int64 [B]): the ragged layout (op verify_ragged): draft_tokens [T], target_tokens
    [T + B], request i's γ_i drafts at [cu[i-1], cu[i]) and its γ_i + 1 targets at [cu[i-1] + i, cu[i] + i + 1)."""
    if cu_num_draft_tokens is not None:
        batch, total = _check_ragged_tokens(draft_tokens, target_tokens, cu_num_draft_tokens)
        entry = _resolve("verify_ragged", impl, draft_tokens.device)
        specs = _output_specs(batch, 0, draft_tokens.dtype, None, None, VERIFY_OUTPUTS)
        buffers = _outputs(out, specs, draft_tokens.device, {"draft_tokens": draft_tokens, "target_tokens": target_tokens,
                                                             "cu_num_draft_tokens": cu_num_draft_tokens})
        workload = _ragged_workload(batch, total, draft_tokens, target_tokens, cu_num_draft_tokens)
        return _launch(entry, workload, buffers)
    batch, gamma = _check_tokens(draft_tokens, target_tokens)
    device = draft_tokens.device
    entry = _resolve("verify", impl, device)
    if entry.name != EAGER:
        _check_contiguous(entry.name, draft_tokens=draft_tokens, target_tokens=target_tokens)
        _check_supports("verify", entry, batch, gamma, draft_tokens.dtype, None)
    specs = _output_specs(batch, gamma, draft_tokens.dtype, None, None, VERIFY_OUTPUTS)
    buffers = _outputs(out, specs, device, {"draft_tokens": draft_tokens, "target_tokens": target_tokens})
    return _run("verify", entry, draft_tokens=draft_tokens, target_tokens=target_tokens, buffers=buffers)


def pack(draft_kv: torch.Tensor, accepted_lengths: torch.Tensor, *, impl: str = "pack_cuda",
         out: Outputs | None = None) -> Outputs:
    """Compact accepted KV rows: packed_kv [B·γ, kv_dim] (first Σ k_i rows valid), packed_offsets [B].

    Above PACK_REPLICATED_MAX_BATCH sequences (ops/pack/cuda_impls), pack_cuda runs the single-pass scan kernel,
    whose flags live in a state per CUDA stream (ops/pack/scan_impls.stream_scan_state): calls on one stream run
    in order; calls that may overlap need different streams."""
    _check_kv(draft_kv, None, None, None, allow_float32=_require_tensor("draft_kv", draft_kv).device.type == "cpu")
    batch, gamma, kv_dim = draft_kv.shape
    device = draft_kv.device
    _check_lengths(accepted_lengths, batch, device)
    entry = _resolve("pack", impl, device)
    if entry.name != EAGER:
        _check_kv(draft_kv, None, None, None, allow_float32=False)
        _check_contiguous(entry.name, draft_kv=draft_kv, accepted_lengths=accepted_lengths)
        _check_supports("pack", entry, batch, gamma, torch.int64, draft_kv)
    specs = _output_specs(batch, gamma, torch.int64, kv_dim, draft_kv.dtype, PACK_OUTPUTS)
    buffers = _outputs(out, specs, device, {"draft_kv": draft_kv, "accepted_lengths": accepted_lengths})
    return _run("pack", entry, draft_kv=draft_kv, accepted_lengths=accepted_lengths, buffers=buffers)


def verify_pack(draft_tokens: torch.Tensor, target_tokens: torch.Tensor, draft_kv: torch.Tensor, *,
                impl: str = "auto", expected_alpha: float | None = None, out: Outputs | None = None,
                cu_num_draft_tokens: torch.Tensor | None = None) -> Outputs:
    """Verify, then pack the accepted KV, in one call; impl="auto" picks fused or two-step by size.

    expected_alpha: expected accepted fraction E[k] / γ in [0, 1] (auto only); None uses the previous
    auto step's mean on this device when known, else 1.0.

    cu_num_draft_tokens (int64 [B]): the ragged layout (op verify_pack_ragged), as verify's, with draft_kv
    [T, kv_dim] laid out like the drafts; packed_kv is then [T, kv_dim] (the first Σ k_i rows valid).
    "auto" is sdbench's ragged pipeline (RAGGED_PACK_DEFAULT_IMPL); expected_alpha is validated, not used.

    Above b = 16, fused is the single-pass scan kernel. In large grids it takes its tiles in pairs when the previous
    single-pass launch on the stream accepted under half its rows, which it reads on the GPU (docs/perf-notes.md,
    "Session 45"). The outputs never depend on it; the first call after acceptance crosses one half still groups by
    the call before it.
    """
    _check_alpha(expected_alpha)
    if cu_num_draft_tokens is not None:
        return _verify_pack_ragged(draft_tokens, target_tokens, draft_kv, cu_num_draft_tokens, impl, out)
    batch, gamma = _check_tokens(draft_tokens, target_tokens)
    device = draft_tokens.device
    _check_kv(draft_kv, batch, gamma, device, allow_float32=device.type == "cpu")
    kv_dim = draft_kv.shape[2]
    track = False
    if impl == "auto":
        alpha = expected_alpha
        if alpha is None and device.type == "cuda":
            alpha = previous_step_alpha(device)
            track = True
        kv_dtype = next((name for name, dtype in KV_DTYPES.items() if dtype == draft_kv.dtype), "float16")
        impl = dispatch.choose(device, batch, gamma, kv_dim, draft_kv.element_size(),
                               DEFAULT_EXPECTED_ALPHA if alpha is None else alpha, kv_dtype).impl
    entry = _resolve("verify_pack", impl, device)
    if entry.name != EAGER:
        _check_kv(draft_kv, batch, gamma, device, allow_float32=False)
        _check_contiguous(entry.name, draft_tokens=draft_tokens, target_tokens=target_tokens, draft_kv=draft_kv)
        _check_supports("verify_pack", entry, batch, gamma, draft_tokens.dtype, draft_kv)
    specs = _output_specs(batch, gamma, draft_tokens.dtype, kv_dim, draft_kv.dtype, VERIFY_OUTPUTS + PACK_OUTPUTS)
    buffers = _outputs(out, specs, device, {"draft_tokens": draft_tokens, "target_tokens": target_tokens,
                                            "draft_kv": draft_kv})
    outputs = _run("verify_pack", entry, draft_tokens=draft_tokens, target_tokens=target_tokens, draft_kv=draft_kv,
                   buffers=buffers)
    if track:
        _previous.setdefault(str(device), _PreviousMean()).record(outputs["accepted_lengths"], gamma)
    return outputs


RAGGED_PACK_DEFAULT_IMPL = "block_triton+pack_triton"


def _check_alpha(expected_alpha) -> None:
    if expected_alpha is not None and not (isinstance(expected_alpha, numbers.Real) and not isinstance(expected_alpha, bool)
                                           and 0.0 <= expected_alpha <= 1.0):
        raise SdbenchError(f"expected_alpha must be a number in [0, 1] (the expected accepted fraction E[k]/γ), "
                           f"got {expected_alpha!r}")


def _verify_pack_ragged(draft_tokens, target_tokens, draft_kv, cu_num_draft_tokens, impl: str, out) -> Outputs:
    batch, total = _check_ragged_tokens(draft_tokens, target_tokens, cu_num_draft_tokens)
    device = draft_tokens.device
    kv = _require_tensor("draft_kv", draft_kv)
    if kv.dim() != 2 or kv.shape[0] != total or kv.shape[1] < 1:
        raise SdbenchError(f"draft_kv must be [T, kv_dim] = [{total}, kv_dim] with kv_dim >= 1 (laid out like "
                           f"draft_tokens) when cu_num_draft_tokens is given, got {_shape(kv)}")
    if impl == "auto":
        entry = _resolve_or_eager("verify_pack_ragged", RAGGED_PACK_DEFAULT_IMPL, device)
    else:
        entry = _resolve("verify_pack_ragged", impl, device)
    allowed = KV_TORCH_DTYPES + ((torch.float32,) if entry.name == EAGER else ())
    if kv.dtype not in allowed:
        raise SdbenchError(f"draft_kv dtype {_dtype_name(kv.dtype)} is not supported here: use "
                           f"{' or '.join(_dtype_name(d) for d in allowed)} (e.g. draft_kv.half())")
    if kv.device != device:
        raise SdbenchError(f"draft_kv is on {kv.device} but the tokens on {device}: move them to one device")
    _check_contiguous(entry.name, draft_kv=kv)
    specs = _output_specs(batch, 0, draft_tokens.dtype, kv.shape[1], kv.dtype, VERIFY_OUTPUTS + PACK_OUTPUTS)
    specs["packed_kv"] = ((total, kv.shape[1]), kv.dtype)
    buffers = _outputs(out, specs, device, {"draft_tokens": draft_tokens, "target_tokens": target_tokens,
                                            "cu_num_draft_tokens": cu_num_draft_tokens, "draft_kv": kv})
    workload = _ragged_workload(batch, total, draft_tokens, target_tokens, cu_num_draft_tokens, kv)
    return _launch(entry, workload, buffers)


def check(outputs: Outputs) -> None:
    """Raise SdbenchError when outputs' error_flags report bad input (a draft token outside [0, V), an
    accepted length outside [0, γ]); outputs without flags pass. This reads the flags to the host, so it
    syncs: call it where you synchronize anyway, never on the hot path (the kernels themselves never sync
    to report bad input; see sdbench.ops.input_contract)."""
    from sdbench.ops.input_contract import check_error_flags

    if not isinstance(outputs, dict):
        raise SdbenchError(f"check takes the outputs dict a verification call returned, got {type(outputs).__name__}")
    check_error_flags(outputs)



# --- probabilistic verification ---------------------------------------------------------------------
PROB_DEFAULT_IMPL = "fused"
PROB_TORCH_DTYPES = (torch.float32, torch.bfloat16)
# Prepared runs kept, least recently used dropped first. A binding holds its input tensors (its kernels read
# them), so fresh tensors every call would pin memory and re-prepare (one sync) every call: an engine passes
# its persistent step buffers.
_PROB_BINDINGS_MAX = 8
_prob_bindings: dict[tuple, object] = {}


def _check_prob_tensors(device: torch.device, target: tuple[str, torch.Tensor], draft: tuple[str, torch.Tensor],
                        uniforms, exponential_noise, uniforms_shape: tuple, noise_shape: tuple) -> None:
    """What the padded and ragged layouts check alike: p and q share a float dtype and the device, with a
    contiguous last dimension; supplied randomness comes whole (both or neither), float32, contiguous."""
    (target_name, target_probs), (draft_name, draft_probs) = target, draft
    if target_probs.dtype not in PROB_TORCH_DTYPES or draft_probs.dtype != target_probs.dtype:
        raise SdbenchError(f"{target_name} and {draft_name} must share a dtype, float32 or bfloat16; got "
                           f"{_dtype_name(target_probs.dtype)} and {_dtype_name(draft_probs.dtype)}")
    for name, tensor in (target, draft):
        if tensor.device != device:
            raise SdbenchError(f"{name} is on {tensor.device} but draft_tokens on {device}: move them to one device")
        if tensor.stride(-1) != 1:
            raise SdbenchError(f"{name} needs a contiguous last dimension (pass {name}.contiguous())")
    if (uniforms is None) != (exponential_noise is None):
        raise SdbenchError("give both uniforms and exponential_noise (supplied randomness) or neither (the "
                           "implementation draws its own from seed and offset)")
    if uniforms is not None:
        for name, tensor, shape in (("uniforms", uniforms, uniforms_shape), ("exponential_noise", exponential_noise,
                                                                             noise_shape)):
            _require_tensor(name, tensor)
            if tuple(tensor.shape) != shape or tensor.dtype != torch.float32 or tensor.device != device:
                raise SdbenchError(f"{name} must be float32 [{', '.join(map(str, shape))}] on {device}, got "
                                   f"{_dtype_name(tensor.dtype)} {_shape(tensor)} on {tensor.device}")
            if not tensor.is_contiguous():
                raise SdbenchError(f"{name} must be contiguous")


def _check_prob_inputs(draft_tokens, target_probs, draft_probs, uniforms, exponential_noise,
                       names: tuple[str, str] = ("target_probs", "draft_probs")) -> tuple[int, int, int]:
    target_name, draft_name = names
    draft = _require_tensor("draft_tokens", draft_tokens)
    target, q = _require_tensor(target_name, target_probs), _require_tensor(draft_name, draft_probs)
    if draft.dim() != 2 or min(draft.shape) < 1:
        raise SdbenchError(f"draft_tokens must be 2-D [batch, gamma] with both >= 1, got shape {_shape(draft)}")
    if draft.dtype not in TOKEN_TORCH_DTYPES:
        raise SdbenchError(f"draft_tokens dtype {_dtype_name(draft.dtype)} is not a token dtype: use int64 or int32")
    batch, gamma = draft.shape
    if target.dim() != 3 or tuple(target.shape[:2]) != (batch, gamma + 1) or target.shape[2] < 2:
        raise SdbenchError(f"{target_name} must be [batch, gamma + 1, V] = [{batch}, {gamma + 1}, V] with V >= 2, "
                           f"got {_shape(target)}")
    vocab = target.shape[2]
    if tuple(q.shape) != (batch, gamma, vocab):
        raise SdbenchError(f"{draft_name} must be [batch, gamma, V] = [{batch}, {gamma}, {vocab}], got {_shape(q)}")
    _check_prob_tensors(draft.device, (target_name, target), (draft_name, q), uniforms, exponential_noise,
                        (batch, gamma), (batch, vocab))
    return batch, gamma, vocab


def _prob_key(impl: str, tensors: tuple, seed: int, logprobs: bool) -> tuple:
    """A binding: the same implementation on the same memory (pointer, shape, stride, dtype) of every input."""
    return (impl, seed, logprobs) + tuple(
        None if t is None else (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype) for t in tensors)


def prob_verify(draft_tokens: torch.Tensor, target_probs: torch.Tensor | None = None,
                draft_probs: torch.Tensor | None = None, *, target_logits: torch.Tensor | None = None,
                draft_logits: torch.Tensor | None = None, target_temperature: torch.Tensor | None = None,
                draft_temperature: torch.Tensor | None = None, impl: str | None = None, seed: int = 0,
                offset: int = 0, uniforms: torch.Tensor | None = None, exponential_noise: torch.Tensor | None = None,
                logprobs: bool = False, out: Outputs | None = None,
                cu_num_draft_tokens: torch.Tensor | None = None, rule: str = "token") -> Outputs:
    """Probabilistic verification (Leviathan rejection sampling with the residual draw): the target's
    distribution exactly, whatever the draft's.

    Inputs: draft_tokens [B, γ] (int64/int32, drawn from q), target_probs p [B, γ+1, V] and draft_probs q
    [B, γ, V] (float32 or bfloat16; log-probabilities with logprobs=True). Outputs: accepted_lengths int64 [B],
    next_tokens [B] and output_tokens [B, γ+1] (the accepted drafts, the next token, then -1) in the token
    dtype, and error_flags int32 [B] from sdbench's kernels (a draft token outside [0, V); see sdbench.check).

    Randomness: with `uniforms` [B, γ] and `exponential_noise` [B, V] (float32) the call consumes them
    (supplied: reproducible, equal to the reference draw for draw); without them the implementation draws
    its own from (seed, offset) — the Triton kernels from an in-kernel Philox stream whose offset advances
    on the device every call, torch_eager from torch's default generator.

    Binding: the first call on a set of input tensors (same memory, shapes, dtypes) prepares the
    implementation — Triton compiles and warms up, which syncs once, so make that call before any CUDA-graph
    capture. Later calls on the same tensors only launch: no host sync, capturable. In the fast mode
    `offset` is where a new binding's stream starts; afterwards the device counter advances by itself.
    The returned tensors are the binding's own buffers, overwritten by its next call; pass `out=` (any of
    the outputs) to have them copied into yours. A binding keeps its input tensors alive; the 8 most
    recently used bindings are kept, so pass persistent step buffers, not fresh tensors every call.

    From logits: pass `target_logits` [B, γ+1, V] and `draft_logits` [B, γ, V] (float32 or bfloat16) with
    `target_temperature` and `draft_temperature` (float32 [B]; 0 = greedy for that request) instead of the
    probabilities: p and q are softmax(logits / T), computed inside the kernels (default impl
    `fused_logits`). Under the token rule a greedy target accepts exactly its argmax drafts and draws its
    argmax next, whatever the draft's distribution, so `fused_logits` does not read that request's draft
    logits (they may hold anything).

    Acceptance rule: `rule="token"` (default) is Leviathan et al.'s token-wise test; `rule="block"` is block
    verification (Sun et al., ICLR 2025): the same output distribution (the target's), never fewer accepted
    drafts in expectation. The block rule runs from logits (`fused_logits`, `torch_eager`); for probabilities,
    pass log p and log q as logits with temperatures 1.

    Ragged draft lengths: pass `cu_num_draft_tokens` (int64 [B], the inclusive prefix sum of γ_i) with the
    flattened inputs draft_tokens [T], draft_probs [T, V] (laid out like the drafts) and target_probs
    [T + B, V] (request i's γ_i + 1 rows at [cu[i-1] + i, cu[i] + i + 1), its bonus row last); supplied
    randomness is uniforms [T] and exponential_noise [B, V]. Outputs: accepted_lengths [B] (k_i <= γ_i),
    next_tokens [B], output_tokens [T + B] laid out like the target rows, error_flags [B] (op
    prob_verify_ragged, default impl `fused`; probabilities only). γ_i = 0 is allowed: the bonus draw alone.
    """
    from_logits = target_logits is not None or draft_logits is not None
    if rule not in RULES:
        raise SdbenchError(f"rule must be one of {', '.join(RULES)}, got {rule!r}")
    if rule != "token" and not from_logits:
        raise SdbenchError(f"rule={rule!r} runs from logits (fused_logits): pass target_logits / draft_logits, or "
                           "log p and log q as logits with target_temperature = draft_temperature = 1")
    if from_logits == (target_probs is not None or draft_probs is not None):
        raise SdbenchError("give the probabilities (target_probs, draft_probs) or the logits (target_logits, "
                           "draft_logits, with target_temperature and draft_temperature), one of the two")
    if cu_num_draft_tokens is not None:
        if from_logits:
            raise SdbenchError("cu_num_draft_tokens (the ragged layout) takes probabilities (target_probs, draft_probs); "
                               "from logits, pass the padded [B, γ + 1, V] layout")
        return _prob_verify_ragged(draft_tokens, target_probs, draft_probs, cu_num_draft_tokens, impl or PROB_DEFAULT_IMPL,
                                   seed, offset, uniforms, exponential_noise, logprobs, out)
    if from_logits:
        return _prob_verify_logits(draft_tokens, target_logits, draft_logits, target_temperature, draft_temperature,
                                   impl or "fused_logits", seed, offset, uniforms, exponential_noise, out, rule)
    impl = impl or PROB_DEFAULT_IMPL
    from sdbench.ops.prob_verify.workload import ProbWorkload

    batch, gamma, vocab = _check_prob_inputs(draft_tokens, target_probs, draft_probs, uniforms, exponential_noise)
    device = draft_tokens.device
    _check_seed(seed, offset)
    entry = _resolve_or_eager("prob_verify", impl, device)
    key = _prob_key(entry.name, (draft_tokens, target_probs, draft_probs, uniforms, exponential_noise), seed, logprobs)
    run = _bound(key)
    if run is None:
        token_name = _token_name(draft_tokens.dtype)
        config = VerifyConfig(batch_size=batch, gamma=gamma, vocab_size=vocab, token_dtype=token_name, seed=seed,
                              prob_dtype=_dtype_name(target_probs.dtype), logprobs=logprobs)
        reason = entry.supports(config)
        if reason is not None:
            raise SdbenchError(f"impl {entry.name!r} cannot run batch={batch}, gamma={gamma}, V={vocab}: {reason}")
        supplied = uniforms is not None
        workload = ProbWorkload(
            config=config, draft_tokens=draft_tokens, target_probs=target_probs, draft_probs=draft_probs,
            # fast mode reads neither: placeholders of the right shape (the noise one is a broadcast row)
            uniforms=uniforms if supplied else torch.empty((batch, gamma), dtype=torch.float32, device=device),
            exponential_noise=(exponential_noise if supplied else
                               torch.ones(vocab, dtype=torch.float32, device=device).expand(batch, vocab)),
            realised_acceptance=float("nan"), randomness="supplied" if supplied else "fast", offset=offset,
        )
        run = _bind(key, entry.prepare(workload))
    return _prob_outputs(run(), out, draft_tokens, (target_probs, draft_probs))


def _check_seed(seed, offset) -> None:
    if not isinstance(seed, int) or isinstance(seed, bool) or not isinstance(offset, int) or isinstance(offset, bool):
        raise SdbenchError(f"seed and offset must be integers, got {seed!r} and {offset!r}")


def _token_name(dtype: torch.dtype) -> str:
    return next(name for name, token_dtype in TOKEN_DTYPES.items() if token_dtype == dtype)


def _bind(key: tuple, run):
    if len(_prob_bindings) >= _PROB_BINDINGS_MAX:
        _prob_bindings.pop(next(iter(_prob_bindings)))
    _prob_bindings[key] = run
    return run


def _bound(key: tuple):
    """The binding for key, marked most recently used; None when there is none."""
    run = _prob_bindings.pop(key, None)
    if run is not None:
        _prob_bindings[key] = run
    return run


def _resolve_or_eager(op: str, impl: str, device: torch.device) -> registry.Implementation:
    """The entry, or on CPU tensors the eager reference when the entry cannot run here (a Triton kernel
    without the interpreter); elsewhere an entry that cannot run is an error."""
    entry = registry.get(op, impl)
    if device.type not in entry.devices or entry.unavailable_reason(device) is not None:
        if device.type != "cpu":
            reason = entry.unavailable_reason(device) or f"runs on {'/'.join(entry.devices)} only"
            raise SdbenchError(f"impl {impl!r} cannot run here: {reason} (try impl={EAGER!r})")
        entry = registry.get(op, EAGER)  # CPU tensors: the eager reference, as the other functions
    return entry


def _prob_verify_logits(draft_tokens, target_logits, draft_logits, target_temperature, draft_temperature, impl: str,
                        seed: int, offset: int, uniforms, exponential_noise, out, rule: str) -> Outputs:
    from sdbench.ops.prob_verify_logits.workload import LogitsConfig, LogitsWorkload

    batch, gamma, vocab = _check_prob_inputs(draft_tokens, target_logits, draft_logits, uniforms, exponential_noise,
                                             names=("target_logits", "draft_logits"))
    device = draft_tokens.device
    for name, tensor in (("target_temperature", target_temperature), ("draft_temperature", draft_temperature)):
        _require_tensor(name, tensor)
        if tuple(tensor.shape) != (batch,) or tensor.dtype != torch.float32 or tensor.device != device:
            raise SdbenchError(f"{name} must be float32 [{batch}] on {device} (0 = greedy for that request), got "
                               f"{_dtype_name(tensor.dtype)} {_shape(tensor)} on {tensor.device}")
    _check_seed(seed, offset)
    entry = _resolve_or_eager("prob_verify_logits", impl, device)
    tensors = (draft_tokens, target_logits, draft_logits, target_temperature, draft_temperature, uniforms,
               exponential_noise)
    key = _prob_key(f"logits:{entry.name}:{rule}", tensors, seed, False)
    run = _bound(key)
    if run is None:
        config = LogitsConfig(batch, gamma, vocab_size=vocab, logits_dtype=_dtype_name(target_logits.dtype),
                              token_dtype=_token_name(draft_tokens.dtype), seed=seed, rule=rule)
        reason = entry.supports(config)
        if reason is not None:
            raise SdbenchError(f"impl {entry.name!r} cannot run batch={batch}, gamma={gamma}, V={vocab}: {reason}")
        supplied = uniforms is not None
        workload = LogitsWorkload(
            config=config, draft_tokens=draft_tokens, target_logits=target_logits, draft_logits=draft_logits,
            target_temperature=target_temperature, draft_temperature=draft_temperature,
            uniforms=uniforms if supplied else torch.empty((batch, gamma), dtype=torch.float32, device=device),
            exponential_noise=(exponential_noise if supplied else
                               torch.ones(vocab, dtype=torch.float32, device=device).expand(batch, vocab)),
            randomness="supplied" if supplied else "fast", offset=offset,
        )
        run = _bind(key, entry.prepare(workload))
    return _prob_outputs(run(), out, draft_tokens, (target_logits, draft_logits))


def _prob_outputs(produced: Outputs, out: Outputs | None, draft_tokens: torch.Tensor, inputs: tuple,
                  output_tokens_shape: tuple[int, ...] | None = None) -> Outputs:
    """The binding's outputs, copied into the caller's `out=` buffers where given. output_tokens is
    [B, γ + 1] (padded) unless its shape is given (ragged: [T + B])."""
    if out is None:
        return produced
    batch = produced["accepted_lengths"].shape[0]
    if output_tokens_shape is None:
        output_tokens_shape = (batch, draft_tokens.shape[1] + 1)
    device = draft_tokens.device
    specs = {"accepted_lengths": ((batch,), torch.int64), "next_tokens": ((batch,), draft_tokens.dtype),
             "output_tokens": (output_tokens_shape, draft_tokens.dtype)}
    if not isinstance(out, dict):
        raise SdbenchError(f"out must be a dict of output tensors keyed by {', '.join(specs)}, got {type(out).__name__}")
    unknown = sorted(set(out) - set(specs))
    if unknown:
        raise SdbenchError(f"out has unknown keys {', '.join(unknown)}; outputs are {', '.join(specs)}")
    buffers = _outputs(out, {name: specs[name] for name in out}, device,
                       {"draft_tokens": draft_tokens, "target_scores": inputs[0], "draft_scores": inputs[1]})
    _copy_into(buffers, produced)  # only the buffers asked for
    return {**produced, **buffers}


def _check_ragged_prob_inputs(draft_tokens, target_probs, draft_probs, cu_num_draft_tokens, uniforms,
                              exponential_noise) -> tuple[int, int, int]:
    """(B, T, V) of the flattened layout; shapes, dtypes, devices and contiguity only."""
    batch, total = _check_ragged_drafts(draft_tokens, cu_num_draft_tokens)
    device = draft_tokens.device
    target, q = _require_tensor("target_probs", target_probs), _require_tensor("draft_probs", draft_probs)
    if target.dim() != 2 or target.shape[0] != total + batch or target.shape[1] < 2:
        raise SdbenchError(f"target_probs must be [T + batch, V] = [{total + batch}, V] with V >= 2 for draft_tokens "
                           f"[{total}] and {batch} requests (each request's γ_i + 1 rows, its bonus row last), got "
                           f"{_shape(target)}")
    vocab = target.shape[1]
    if tuple(q.shape) != (total, vocab):
        raise SdbenchError(f"draft_probs must be [T, V] = [{total}, {vocab}] (laid out like draft_tokens), got {_shape(q)}")
    _check_prob_tensors(device, ("target_probs", target), ("draft_probs", q), uniforms, exponential_noise, (total,),
                        (batch, vocab))
    return batch, total, vocab


def _prob_verify_ragged(draft_tokens, target_probs, draft_probs, cu_num_draft_tokens, impl: str, seed: int,
                        offset: int, uniforms, exponential_noise, logprobs: bool, out) -> Outputs:
    from sdbench.ops.prob_verify_ragged.workload import RaggedProbWorkload

    batch, total, vocab = _check_ragged_prob_inputs(draft_tokens, target_probs, draft_probs, cu_num_draft_tokens,
                                                    uniforms, exponential_noise)
    device = draft_tokens.device
    _check_seed(seed, offset)
    entry = _resolve_or_eager("prob_verify_ragged", impl, device)
    tensors = (draft_tokens, target_probs, draft_probs, cu_num_draft_tokens, uniforms, exponential_noise)
    key = _prob_key(f"ragged:{entry.name}", tensors, seed, logprobs)
    run = _bound(key)
    if run is None:
        # γ_max is T, an upper bound from the shapes (the offsets' values are never read): it sizes only the
        # kernels' scan width and the serial peer's grid, both capped.
        config = VerifyConfig(batch_size=batch, gamma=max(total, 1), vocab_size=vocab, seed=seed, logprobs=logprobs,
                              token_dtype=_token_name(draft_tokens.dtype), prob_dtype=_dtype_name(target_probs.dtype))
        supplied = uniforms is not None
        workload = RaggedProbWorkload(
            config=config, draft_tokens=draft_tokens, target_probs=target_probs, draft_probs=draft_probs,
            cu_num_draft_tokens=cu_num_draft_tokens, draft_lengths=torch.empty(batch, dtype=torch.int64, device=device),
            # fast mode reads neither: placeholders of the right shape (the noise one is a broadcast row)
            uniforms=uniforms if supplied else torch.empty(total, dtype=torch.float32, device=device),
            exponential_noise=(exponential_noise if supplied else
                               torch.ones(vocab, dtype=torch.float32, device=device).expand(batch, vocab)),
            randomness="supplied" if supplied else "fast", offset=offset,
        )
        run = _bind(key, entry.prepare(workload))
    return _prob_outputs(run(), out, draft_tokens, (target_probs, draft_probs), output_tokens_shape=(total + batch,))
