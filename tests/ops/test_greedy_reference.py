"""References against hand-checked cases and against a plain Python loop (property tests)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from sdbench.ops.pack import reference as pack_reference
from sdbench.ops.verify import reference as verify_reference


def test_verify_hand_checked():
    draft = torch.tensor([[5, 6, 7], [5, 6, 7], [1, 2, 3]])
    target = torch.tensor([[5, 6, 7, 9], [5, 0, 7, 9], [0, 2, 3, 4]])
    out = verify_reference.verify(draft, target)
    assert out["accepted_lengths"].tolist() == [3, 1, 0]
    assert out["has_mismatch"].tolist() == [False, True, True]
    assert out["next_tokens"].tolist() == [9, 0, 0]


def test_pack_hand_checked():
    kv = torch.arange(2 * 3 * 2, dtype=torch.float16).reshape(2, 3, 2)
    out = pack_reference.pack(kv, torch.tensor([2, 1]))
    assert out["packed_kv"].tolist() == [[0, 1], [2, 3], [6, 7]]
    assert out["packed_offsets"].tolist() == [0, 2]


def _loop_verify(draft, target):
    lengths, mismatch, nexts = [], [], []
    for row_d, row_t in zip(draft, target, strict=False):
        k = 0
        while k < len(row_d) and row_d[k] == row_t[k]:
            k += 1
        lengths.append(k)
        mismatch.append(k < len(row_d))
        nexts.append(row_t[k])
    return lengths, mismatch, nexts


@st.composite
def token_batches(draw):
    batch = draw(st.integers(1, 6))
    gamma = draw(st.integers(1, 40))
    vocab = draw(st.integers(2, 4))  # tiny vocabularies give long runs of agreement
    draft = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=gamma, max_size=gamma), min_size=batch, max_size=batch))
    target = draw(st.lists(st.lists(st.integers(0, vocab - 1), min_size=gamma + 1, max_size=gamma + 1), min_size=batch, max_size=batch))
    return draft, target


@settings(max_examples=200, deadline=None)
@given(token_batches(), st.sampled_from([torch.int64, torch.int32]))
def test_verify_matches_python_loop(batch, dtype):
    draft, target = batch
    out = verify_reference.verify(torch.tensor(draft, dtype=dtype), torch.tensor(target, dtype=dtype))
    lengths, mismatch, nexts = _loop_verify(draft, target)
    assert out["accepted_lengths"].tolist() == lengths
    assert out["accepted_lengths"].dtype == torch.int64
    assert out["has_mismatch"].tolist() == mismatch
    assert out["next_tokens"].tolist() == nexts and out["next_tokens"].dtype == dtype


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 6), st.integers(1, 12), st.integers(1, 5), st.data())
def test_pack_matches_python_loop(batch, gamma, kv_dim, data):
    lengths = data.draw(st.lists(st.integers(0, gamma), min_size=batch, max_size=batch))
    kv = torch.randn(batch, gamma, kv_dim).to(torch.bfloat16)
    out = pack_reference.pack(kv, torch.tensor(lengths))
    rows = [kv[i, j] for i in range(batch) for j in range(lengths[i])]
    expected = torch.stack(rows) if rows else torch.empty(0, kv_dim, dtype=torch.bfloat16)
    assert torch.equal(out["packed_kv"], expected)
    offsets, running = [], 0
    for k in lengths:
        offsets.append(running)
        running += k
    assert out["packed_offsets"].tolist() == offsets


def test_pack_clamps_lengths_outside_0_gamma_and_flags_them():
    # the case: lengths [1, 9, 0] with γ = 4 gave offsets [0, 1, 10]; and a negative length
    kv = torch.arange(3 * 4 * 2, dtype=torch.float16).reshape(3, 4, 2)
    out = pack_reference.pack(kv, torch.tensor([1, 9, 0]))
    assert out["packed_offsets"].tolist() == [0, 1, 5]
    assert torch.equal(out["packed_kv"], torch.cat([kv[0, :1], kv[1, :4]]))
    assert out["error_flags"].tolist() == [0, 2, 0]
    out = pack_reference.pack(kv, torch.tensor([2, -3, 4]))
    assert out["packed_offsets"].tolist() == [0, 2, 2]
    assert torch.equal(out["packed_kv"], torch.cat([kv[0, :2], kv[2, :4]]))
    assert out["error_flags"].tolist() == [0, 2, 0]
