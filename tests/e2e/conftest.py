"""Tiny randomly initialised GPT-2 pairs, saved with save_pretrained and loaded by path (the real loading code).

The target is a 2-layer, 32-wide GPT-2 over 96 tokens with a large init range (0.5), so its greedy output
varies instead of repeating one token; the "close" draft is the target plus N(0, 0.02) weight noise
(greedy acceptance ~0.5 at γ = 4), the "far" draft an independent model (acceptance ~0: exercises the
residual of sampling verification).
"""

from __future__ import annotations

import pytest
import torch

VOCAB = 96
EOS = 1
PROMPTS = [[2, 3, 4, 5, 6], [7, 8], [9], [10, 11, 12, 13, 14, 15, 16, 17], [20, 30, 40]]


def _config(eos_token_id):
    from transformers import GPT2Config

    return GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=VOCAB, n_positions=256, initializer_range=0.5,
                      bos_token_id=0, eos_token_id=eos_token_id, pad_token_id=0)


def _save_pair(root, eos_token_id):
    from transformers import GPT2LMHeadModel
    from transformers.utils import logging

    logging.set_verbosity_error()
    logging.disable_progress_bar()
    torch.manual_seed(0)
    target = GPT2LMHeadModel(_config(eos_token_id))
    close = GPT2LMHeadModel(_config(eos_token_id))
    close.load_state_dict(target.state_dict())
    with torch.no_grad():
        for parameter in close.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    torch.manual_seed(1)
    far = GPT2LMHeadModel(_config(eos_token_id))
    for name, model in (("target", target), ("close", close), ("far", far)):
        model.save_pretrained(root / name)
    return root


@pytest.fixture(scope="session")
def pair_dir(tmp_path_factory):
    """Checkpoints without an EOS token (every sequence runs to max_new_tokens)."""
    return _save_pair(tmp_path_factory.mktemp("pair"), None)


@pytest.fixture(scope="session")
def eos_pair_dir(tmp_path_factory):
    """Checkpoints whose EOS (token 1) the target emits early in some sequences."""
    return _save_pair(tmp_path_factory.mktemp("eos_pair"), EOS)


def load(directory, name):
    from sdbench.e2e.models import load_model

    return load_model(directory / name, name, torch.device("cpu"), "float32", attn_implementation="eager")


@pytest.fixture(scope="session")
def models(pair_dir):
    return {name: load(pair_dir, name) for name in ("target", "close", "far")}
