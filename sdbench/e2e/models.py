"""Loading a draft/target pair of local HuggingFace causal LMs (nothing is fetched from a hub)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from sdbench.e2e.verifier import SdbenchError

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


@dataclass
class ModelPair:
    target: torch.nn.Module
    draft: torch.nn.Module
    tokenizer: object | None  # a transformers tokenizer, or None when the target directory has none
    target_name: str
    draft_name: str

    @property
    def vocab_size(self) -> int:
        return self.target.get_output_embeddings().weight.shape[0]

    @property
    def eos_token_id(self) -> int | None:
        eos = getattr(self.target.config, "eos_token_id", None)
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return eos if eos is not None and 0 <= eos < self.vocab_size else None

    @property
    def pad_token_id(self) -> int:
        pad = getattr(self.target.config, "pad_token_id", None)
        return pad if pad is not None and 0 <= pad < self.vocab_size else (self.eos_token_id or 0)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _check_dir(role: str, path: str | Path) -> Path:
    directory = Path(path).expanduser()
    if not directory.is_dir():
        raise SdbenchError(f"{role} checkpoint {str(directory)!r} does not exist: pass a local directory holding a "
                           f"HuggingFace causal LM (config.json + weights, as save_pretrained writes), or leave out "
                           f"--target/--draft to use the built-in pair")
    if not (directory / "config.json").is_file():
        raise SdbenchError(f"{role} checkpoint {str(directory)!r} has no config.json: point --{role} at the directory "
                           "save_pretrained wrote")
    return directory


def load_model(path: str | Path, role: str, device: torch.device, dtype: str = "float32",
               attn_implementation: str = "sdpa"):
    from transformers import AutoModelForCausalLM

    directory = _check_dir(role, path)
    if dtype not in DTYPES:
        raise SdbenchError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    model = AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=DTYPES[dtype],
                                                 attn_implementation=attn_implementation)
    return model.to(device).eval()


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    directory = Path(path).expanduser()
    if not any((directory / name).is_file() for name in ("tokenizer.json", "tokenizer_config.json", "vocab.json")):
        return None
    return AutoTokenizer.from_pretrained(directory, local_files_only=True)


def load_pair(target_dir: str | Path, draft_dir: str | Path, device: torch.device, dtype: str = "float32",
              attn_implementation: str = "sdpa") -> ModelPair:
    target = load_model(target_dir, "target", device, dtype, attn_implementation)
    draft = load_model(draft_dir, "draft", device, dtype, attn_implementation)
    target_vocab = target.get_output_embeddings().weight.shape[0]
    draft_vocab = draft.get_output_embeddings().weight.shape[0]
    if target_vocab != draft_vocab:
        raise SdbenchError(f"the target's vocabulary has {target_vocab} entries but the draft's {draft_vocab}: "
                           "speculative decoding needs a pair that shares one tokenizer")
    return ModelPair(target=target, draft=draft, tokenizer=load_tokenizer(target_dir),
                     target_name=Path(target_dir).name, draft_name=Path(draft_dir).name)
