"""run_e2e end to end on CPU: rows, parquet schema, the trace sweep reads, errors, the built-in pair."""

from __future__ import annotations

import math

import pyarrow.parquet as pq
import pytest
import torch

from sdbench.e2e import E2EOptions, run_e2e
from sdbench.e2e.builtin import LMShape, PairRecipe, ensure_builtin_pair
from sdbench.e2e.results import SCHEMA
from sdbench.e2e.verifier import SdbenchError, read_trace

PROMPT_IDS = ((2, 3, 4), (5, 6, 7, 8, 9, 10), (11,))
MICRO_RECIPE = PairRecipe(vocab_size=300, context=32, target=LMShape(2, 32, 2), draft=LMShape(1, 16, 2),
                          train_steps=30, batch_size=8, max_corpus_bytes=300_000)


def _options(pair_dir, tmp_path, **changes):
    base = dict(target=str(pair_dir / "target"), draft=str(pair_dir / "close"), prompt_token_ids=PROMPT_IDS,
                batch_size=3, max_new_tokens=12, device="cpu", attn_implementation="eager", warmup=False,
                out=str(tmp_path / "e2e.parquet"), trace_out=str(tmp_path / "trace.txt"))
    return E2EOptions(**{**base, **changes})


def test_greedy_run_writes_rows_parquet_and_trace(pair_dir, tmp_path):
    result = run_e2e(_options(pair_dir, tmp_path, verify_impls=("torch_eager", "ballot")))
    methods = [(row["method"], row["verify_impl"]) for row in result.rows]
    assert methods == [("target_only", ""), ("speculative", "torch_eager"), ("speculative", "ballot"),
                       ("hf_assisted", "")]
    table = pq.read_table(result.parquet_path)
    assert table.schema == SCHEMA and table.num_rows == 4
    speculative = result.rows[1]
    assert speculative["matches_target"] is True
    assert result.outputs["hf_assisted"] == result.outputs["target_only"]  # HF's loop agrees, greedy
    assert 0 < speculative["target_forwards_per_token"] < 1
    assert all(speculative[f"{phase}_us"] > 0 for phase in ("draft", "target", "verify", "bookkeeping"))
    trace = read_trace(result.trace_path, gamma=4)
    assert trace.tolist() == [k for row in result.accepted_lengths for k in row]
    assert math.isclose(speculative["mean_accepted_length"], trace.double().mean().item())


def test_sampling_run_uses_prob_verify(pair_dir, tmp_path):
    result = run_e2e(_options(pair_dir, tmp_path, temperature=0.8, sort_by_acceptance=True, hf_assisted=False))
    row = result.rows[1]
    assert row["operation"] == "prob_verify" and row["matches_target"] is None
    assert all(len(tokens) == 12 for tokens in result.outputs["torch_eager"])


def test_missing_checkpoint_is_a_one_line_error(pair_dir, tmp_path):
    with pytest.raises(SdbenchError, match="does not exist.*built-in pair"):
        run_e2e(_options(pair_dir, tmp_path, target=str(tmp_path / "nowhere")))


def test_unknown_verify_impl_names_the_known_ones(pair_dir, tmp_path):
    with pytest.raises(SdbenchError, match="known: .*torch_eager"):
        run_e2e(_options(pair_dir, tmp_path, verify_impls=("balot",)))


def test_builtin_pair_trains_once_and_reports_loss_and_acceptance(tmp_path, monkeypatch):
    first = ensure_builtin_pair(MICRO_RECIPE, "cpu", root=tmp_path)
    again = ensure_builtin_pair(MICRO_RECIPE, "cpu", root=tmp_path)
    assert first.trained_now and not again.trained_now and again.path == first.path
    assert first.path.name == f"builtin-pair-{MICRO_RECIPE.digest()}"
    metrics = first.metrics
    assert metrics["target_held_out_loss"] < math.log(300)  # it learned something beyond uniform
    assert 0.0 <= metrics["greedy_acceptance_rate"] <= 1.0
    assert metrics["target_parameters"] > metrics["draft_parameters"]

    monkeypatch.setenv("SDBENCH_CACHE", str(tmp_path))
    progress = []
    result = run_e2e(E2EOptions(builtin_recipe=MICRO_RECIPE, batch_size=2, max_new_tokens=6, device="cpu",
                                warmup=False, hf_assisted=False, progress=lambda *a: progress.append(a)))
    assert not progress  # cached: nothing retrained
    assert result.pair_metrics["recipe_digest"] == MICRO_RECIPE.digest()
    assert result.rows[1]["matches_target"] is True
    assert torch.tensor(result.rows[1]["acceptance_rate"]).isfinite()


def test_cli_runs_local_checkpoints_and_prints_the_table(pair_dir, tmp_path):
    import shutil

    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from typer.testing import CliRunner

    from sdbench.cli import app

    target = tmp_path / "target-with-tokenizer"  # text prompts need a tokenizer beside the target
    shutil.copytree(pair_dir / "target", target)
    words = Tokenizer(models.WordLevel({chr(ord("a") + i): 2 + i for i in range(26)} | {"<unk>": 1}, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>").save_pretrained(target)
    result = CliRunner().invoke(app, [
        "e2e", "--target", str(target), "--draft", str(pair_dir / "close"), "--device", "cpu", "--prompt", "abc",
        "--prompt", "speculative",
        "--batch-size", "2", "--max-new-tokens", "6", "--no-hf-assisted",
        "--out", str(tmp_path / "cli.parquet"),
    ], env={"COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    assert "speculative" in result.output and "torch_eager" in result.output
    assert pq.read_table(tmp_path / "cli.parquet").num_rows == 2  # target alone + one verify impl


def test_cli_missing_checkpoint_is_one_line_and_exit_2(tmp_path):
    from typer.testing import CliRunner

    from sdbench.cli import app

    result = CliRunner().invoke(app, ["e2e", "--target", str(tmp_path / "nope"), "--draft", str(tmp_path / "nope"),
                                      "--device", "cpu"])
    assert result.exit_code == 2
    assert "does not exist" in result.output and "Traceback" not in result.output
