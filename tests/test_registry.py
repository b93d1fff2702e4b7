"""The registry: every operation has its torch reference, keys are unique, unavailable entries say why."""

import pytest
import torch

from sdbench import registry
from sdbench.errors import SdbenchError
from sdbench.ops.workload import VerifyConfig


def test_every_greedy_operation_has_a_torch_eager_peer():
    for op in ("verify", "pack", "verify_pack"):
        impl = registry.get(op, "torch_eager")
        assert impl.backend == "torch" and impl.peer and "cpu" in impl.devices


def test_keys_are_unique_and_fields_valid():
    impls = registry.implementations()
    assert len({impl.key for impl in impls}) == len(impls)
    for impl in impls:
        assert impl.op in registry.OPERATIONS and impl.backend in registry.BACKENDS
        assert impl.description


def test_unavailable_implementations_carry_reasons_on_cpu():
    cpu_only_machine = not torch.cuda.is_available()
    for impl in registry.implementations():
        reason = impl.unavailable_reason("cpu")
        if impl.devices == ("cuda",):
            assert isinstance(reason, str) and reason, impl.key
    if cpu_only_machine:
        cuda_impls = [impl for impl in registry.implementations() if impl.devices == ("cuda",)]
        assert all(impl.unavailable_reason("cuda") for impl in cuda_impls)


def test_config_level_reason_for_kv_ops_without_kv():
    impl = registry.get("pack", "torch_eager")
    assert impl.unavailable_reason("cpu", VerifyConfig(4, 8, kv_dim=0)) == "needs draft KV (kv_dim >= 1)"
    assert impl.unavailable_reason("cpu", VerifyConfig(4, 8, kv_dim=8)) is None


def test_unknown_names_suggest_the_closest():
    with pytest.raises(SdbenchError, match="did you mean 'torch_eager'"):
        registry.get("verify", "torch_eagr")
    with pytest.raises(SdbenchError, match="unknown operation"):
        registry.get("verfy", "torch_eager")


def test_register_rejects_duplicates():
    impl = registry.get("verify", "torch_eager")
    with pytest.raises(ValueError, match="twice"):
        registry.register(impl)
