import argparse
import json
import math
import shutil

import numpy as np
import pytest
import torch

from kestrel.evaluation import load_checkpoint
from kestrel.train import corpus, trainer
from kestrel.train.tokenizer_train import BOS, EOS


def _args(*flags: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    trainer.add_train_args(parser)
    return parser.parse_args(list(flags))


# k3-tiny with k3-small's tied embeddings
TIED = '{"tie_word_embeddings": true}'


def _tiny(out, tokenizer_dir, *extra):
    return _args("--out", str(out), "--preset", "k3-tiny", "--model-overrides", TIED, "--tokenizer", str(tokenizer_dir),
                 "--code-files", "20",
                 "--arith-docs", "500", "--seq-len", "32", "--batch-size", "4", "--max-steps", "10",
                 "--warmup-steps", "2", "--save-every", "4", "--lr", "5e-3", "--device", "cpu", "--no-progress", *extra)


def _log(out) -> list[dict]:
    return [json.loads(line) for line in (out / "train_log.jsonl").read_text().splitlines()]


def test_tiny_run_learns_exports_and_resumes_exactly(tmp_path, tokenizer_dir, monkeypatch):
    a = tmp_path / "a"
    model_dir = trainer.run_train(_tiny(a, tokenizer_dir))
    losses = [r["loss"] for r in _log(a)]
    assert [r["step"] for r in _log(a)] == list(range(1, 11))
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.2, losses

    # the export is a loadable bf16 checkpoint of the trained weights that stops on both end tokens, with its
    # tokenizer and summary
    model = load_checkpoint(model_dir)
    trained = torch.load(a / "ckpt.pt", weights_only=False)["model"]
    ref = trainer.build_model(trainer.TrainArgs(preset="k3-tiny", model_overrides=TIED))
    ref.load_state_dict({k: v.to(torch.bfloat16).float() if v.is_floating_point() and not k.endswith(
        ("A_log", "dt_bias", "gate.weight", "e_score_correction_bias")) else v for k, v in trained.items()})
    tokens = list(range(10, 60))
    assert torch.allclose(model.reference_logits(tokens), ref.reference_logits(tokens), atol=1e-5)
    assert model.reference_logits(tokens).std() > 0.05  # trained logits, not an all-zero head
    assert model.cfg.eos_token_ids == (2, 7) and model.cfg.bos_token_id == 1
    assert json.loads((model_dir / "config.json").read_text())["torch_dtype"] == "bfloat16"
    assert (model_dir / "tokenizer.json").exists() and (model_dir / "generation_config.json").exists()
    summary = json.loads((model_dir / "training_summary.json").read_text())
    assert summary["steps"] == 10 and summary["tokens"] == 10 * 4 * 32 and summary["device"] == "cpu"

    # a run that dies after step 5 restarts from its step-4 checkpoint and retraces the uninterrupted run
    b = tmp_path / "b"
    shutil.copytree(a / "data", b / "data")
    real_step, calls = trainer.train_step, []

    def dying_step(*args):
        calls.append(1)
        if len(calls) == 6:
            raise RuntimeError("simulated crash")
        return real_step(*args)

    monkeypatch.setattr(trainer, "train_step", dying_step)
    with pytest.raises(RuntimeError, match="simulated crash"):
        trainer.run_train(_tiny(b, tokenizer_dir))
    monkeypatch.setattr(trainer, "train_step", real_step)
    assert torch.load(b / "ckpt.pt", weights_only=False)["state"]["step"] == 4
    trainer.run_train(_tiny(b, tokenizer_dir, "--resume"))
    resumed = _log(b)[5:]
    assert [r["step"] for r in resumed] == list(range(5, 11))
    assert [r["loss"] for r in resumed] == losses[4:]


def test_block_sampler_is_a_pure_function_of_step_and_position():
    pool = corpus.DocPool(tokens=np.arange(1000, dtype=np.uint16) % 50 + 10,
                          offsets=np.array([0, 100, 250, 600, 1000]))
    args = trainer.TrainArgs(batch_size=16, seq_len=31, arith_fraction=0.25)
    first = trainer.BlockSampler(pool, pool, args)
    batches = [first.batch(s) for s in range(6)]
    again = trainer.BlockSampler(pool, pool, args)
    again.batch(0), again.batch(1), again.batch(2)
    positions = again.code.position, again.arith.position
    fresh = trainer.BlockSampler(pool, pool, args)
    fresh.code.seek(positions[0])
    fresh.arith.seek(positions[1])
    for s in range(3, 6):
        blocks, is_arith = fresh.batch(s)
        assert torch.equal(blocks, batches[s][0]) and torch.equal(is_arith, batches[s][1])
    share = torch.cat([b[1] for b in batches]).float().mean().item()
    assert 0.1 < share < 0.45
    assert batches[0][0].shape == (16, 32)


def test_token_stream_reshuffles_each_epoch():
    pool = corpus.DocPool(tokens=np.arange(60, dtype=np.uint16), offsets=np.arange(0, 61, 6))
    stream = trainer.TokenStream(pool, seed=0, name="code")
    epoch0, epoch1 = stream.take(60), stream.take(60)
    assert sorted(epoch0) == sorted(epoch1) == list(range(60))
    assert not np.array_equal(epoch0, epoch1)
    assert stream.position == (2, 0)


def test_doc_pool_wraps_documents(tokenizer_dir):
    from tokenizers import Tokenizer

    pool = corpus.DocPool.encode(Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json")), ["a = 1", "", "b"])
    assert pool.num_docs == 3
    assert pool.doc(1).tolist() == [BOS, EOS]
    assert pool.doc(0)[0] == BOS and pool.doc(0)[-1] == EOS


def test_learning_rate_schedule():
    args = trainer.TrainArgs(lr=1e-3, warmup_steps=10, min_lr_ratio=0.1)
    assert trainer.lr_at(0, args, 100) == pytest.approx(1e-4)
    assert trainer.lr_at(9, args, 100) == pytest.approx(1e-3)
    assert trainer.lr_at(55, args, 100) == pytest.approx(0.55e-3)
    assert trainer.lr_at(100, args, 100) == pytest.approx(1e-4)
    assert all(trainer.lr_at(s, args, 100) >= trainer.lr_at(s + 1, args, 100) for s in range(10, 100))


def test_init_weights_small_preset():
    model = trainer.build_model(trainer.TrainArgs())
    params = dict(model.named_parameters())
    assert model.cfg.tie_word_embeddings and model.lm_head.weight is model.model.embed_tokens.weight
    assert model.cfg.eos_token_ids == (2, 7)
    layers = model.cfg.num_hidden_layers
    assert params["model.embed_tokens.weight"].std().item() == pytest.approx(0.02, rel=0.02)
    assert params["model.layers.1.self_attn.o_proj.weight"].std().item() == pytest.approx(
        0.02 / math.sqrt(2 * layers), rel=0.05)
    assert torch.all(params["model.layers.3.input_layernorm.weight"] == 1)
    assert torch.all(params["model.layers.3.attn_res.proj_weight"] == 0)
    dt = torch.nn.functional.softplus(params["model.layers.0.self_attn.dt_bias"])
    assert 1e-3 <= dt.min().item() and dt.max().item() <= 0.1 + 1e-6
    assert 8e6 < sum(p.numel() for p in model.parameters()) < 13e6


def test_bad_flags_are_named():
    with pytest.raises(ValueError, match="--arith-fraction"):
        trainer.TrainArgs(arith_fraction=1.5)
    with pytest.raises(ValueError, match="--precision"):
        trainer.TrainArgs(precision="fp8")


def test_wall_clock_budget_sets_the_schedule(tmp_path, tokenizer_dir):
    out = tmp_path / "run"
    model_dir = trainer.run_train(_tiny(out, tokenizer_dir, "--max-minutes", "0.15", "--max-steps", "100000",
                                        "--batch-size", "1", "--seq-len", "8"))
    summary = json.loads((model_dir / "training_summary.json").read_text())
    # the timed steps turned 9 seconds into a schedule far shorter than the step budget, and the loop kept to it
    assert trainer.CALIBRATE_FROM + 20 <= summary["schedule_steps"] < 100000
    assert summary["steps"] <= summary["schedule_steps"]
    assert summary["train_seconds"] < 9 + 1.5


def test_prepare_only_builds_tokenizer_and_corpus_once(tmp_path):
    out = tmp_path / "run"
    flags = ["--out", str(out), "--code-files", "40", "--arith-docs", "300", "--prepare-only", "--no-progress"]
    data = trainer.run_train(_args(*flags))
    info = json.loads((data / "corpus.json").read_text())
    assert info["code_files"] == 40 and info["arith_docs"] == 300 and info["code_tokens"] > 100_000
    assert (out / "tokenizer" / "tokenizer.json").exists() and not (out / "ckpt.pt").exists()
    code, arith_pool, _ = corpus.load_corpus(data)
    assert arith_pool.num_docs == 300 and code.num_docs == 40
    assert code.tokens.max() < 4096 and code.tokens[0] == BOS
    with pytest.raises(ValueError, match="arith_docs = 300, not 400"):
        trainer.run_train(_args(*flags[:5], "400", *flags[6:]))
