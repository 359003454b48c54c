"""LoRA (lora.py): the adapters are all that trains, the policy starts as the base model, and what leaves the trainer
(the weight push, the checkpoint's Hugging Face files) is the merged policy that a plain model reproduces."""
import dataclasses
import os
import types

import pytest
import torch

import checkpoint
import lora
import transport
from config import ConfigError, load_config
from conftest import ROOT, read_run, torchrun
from learner import Learner, checkpointing, policy_model
from policy import load_model, load_tokenizer, token_logprobs
from test_trainer_group import FakeGroup, random_batch

PROMPTS, RESPONSES = [[1, 5, 6, 7], [1, 9, 8]], [[10, 11, 12], [13, 14]]


def tiny_cfg(**kw):
    return dataclasses.replace(load_config(os.path.join(ROOT, "configs", "tiny.yaml")), B=2, K=4, **kw)


def trained(tiny_model, steps=2, **kw):
    """A LoRA learner on the tiny model after `steps` updates on a random batch (lr 1e-2: the adapters move)."""
    cfg = tiny_cfg(lora_rank=4, lr=1e-2, **kw)
    prompts, flat, totals = random_batch(cfg, seed=0, rewards=3)
    model = checkpointing(policy_model(cfg, None, "cpu").train(), cfg)
    learner = Learner(cfg, None, prompts, model, FakeGroup(model))
    for step in range(1, steps + 1):
        assert learner.update(flat, totals, step).finite
    return cfg, learner


def test_the_adapted_policy_starts_as_the_base_and_only_adapters_train(tiny_model):
    base = load_model(tiny_model, "float32", "cpu")
    before = {n: p.clone() for n, p in base.named_parameters()}
    model = lora.add(load_model(tiny_model, "float32", "cpu"), 4, 8.0)
    names = [n for n, _ in model.named_parameters() if lora.is_adapter(n)]
    assert len(names) == 2 * 7 * 2  # q, k, v, o, gate, up, down in each of the 2 decoder layers: A and B
    torch.testing.assert_close(token_logprobs(model, PROMPTS, RESPONSES, 1.0)[0],
                               token_logprobs(base, PROMPTS, RESPONSES, 1.0)[0], rtol=0, atol=0)  # B = 0
    cfg, learner = trained(tiny_model)
    assert {id(p) for g in learner.opt.param_groups for p in g["params"]} == \
        {id(p) for n, p in learner.model.named_parameters() if lora.is_adapter(n)}
    assert all(torch.equal(p, before[n]) for n, p in learner.model.named_parameters() if n in before)  # frozen
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in learner.model.named_parameters() if "lora_B" in n)


def test_activation_checkpointing_trains_the_adapters_as_without(tiny_model):
    """grad_checkpointing with frozen base weights: the recompute gives the adapters the gradients they get without
    it, so the two learners end the same."""
    _, plain = trained(tiny_model)
    _, ckpt = trained(tiny_model, grad_checkpointing=True)
    assert ckpt.model.is_gradient_checkpointing
    adapters = {n: p for n, p in plain.model.named_parameters() if lora.is_adapter(n)}
    for n, p in ckpt.model.named_parameters():
        if lora.is_adapter(n):
            torch.testing.assert_close(p, adapters[n], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in ckpt.model.named_parameters() if "lora_B" in n)


def test_the_merged_weights_are_the_adapted_policy(tiny_model):
    """A plain model loaded with merged_weights gives the adapted model's log-probs; the push's names are the base
    model's, without the adapters."""
    cfg, learner = trained(tiny_model)
    model = learner.model.eval()
    plain = load_model(tiny_model, "float32", "cpu")
    merged = lora.merged_weights(model, buffers=True)
    assert set(merged) == set(plain.state_dict())
    plain.load_state_dict(dict(merged.items()))
    assert not torch.allclose(token_logprobs(plain, PROMPTS, RESPONSES, 1.0)[0],
                              token_logprobs(load_model(tiny_model, "float32", "cpu"), PROMPTS, RESPONSES, 1.0)[0])
    torch.testing.assert_close(token_logprobs(plain, PROMPTS, RESPONSES, 1.0)[0],
                               token_logprobs(model, PROMPTS, RESPONSES, 1.0)[0], rtol=1e-5, atol=1e-5)
    comm = types.SimpleNamespace(rank=0, broadcast_object=lambda meta: meta, new_gloo_group=lambda name: None)
    pushed = transport.WeightTransport(comm, "gloo", "float32", 1, "cpu", model)
    assert [n for b in pushed.buckets for n, *_ in b] == [n for n, _ in plain.named_parameters()]
    name = "model.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(pushed.params[name], dict(plain.named_parameters())[name])


def test_a_checkpoint_holds_the_merged_policy_and_resume_restores_the_adapters(tiny_model, tmp_path):
    cfg, learner = trained(tiny_model)
    model = learner.model.eval()
    state = dict(meta={}, step=2, places={}, ref_weights=None)
    checkpoint.save(str(tmp_path / "step_2"), model, load_tokenizer(tiny_model), state)
    assert sorted(os.listdir(tmp_path / "step_2")).count(lora.ADAPTERS) == 1
    saved = load_model(str(tmp_path / "step_2"), "float32", "cpu")  # eval.py / vLLM: a plain HF checkpoint
    assert not any(lora.is_adapter(n) for n, _ in saved.named_parameters())
    torch.testing.assert_close(token_logprobs(saved, PROMPTS, RESPONSES, 1.0)[0],
                               token_logprobs(model, PROMPTS, RESPONSES, 1.0)[0], rtol=1e-5, atol=1e-5)
    resumed = policy_model(cfg, str(tmp_path / "step_2"), "cpu")  # the base model plus the checkpoint's adapters
    for (n, a), (m, b) in zip(resumed.named_parameters(), model.named_parameters()):
        assert n == m and torch.equal(a, b)
    with pytest.raises(Exception, match="does not match|shape"):
        policy_model(dataclasses.replace(cfg, lora_rank=2), str(tmp_path / "step_2"), "cpu")


def test_lora_refuses_what_it_cannot_do_in_one_line():
    for overrides, message in [(["lora_rank=4", "weight_delay=1"], "lora_rank with weight_delay"),
                               (["lora_rank=4", "n_trainers=2", "B=4", "trainer_parallel=fsdp"],
                                "needs trainer_parallel=ddp")]:
        with pytest.raises(ConfigError, match=message):
            load_config(os.path.join(ROOT, "configs", "tiny.yaml"), overrides)


def test_a_lora_run_learns_saves_merged_weights_and_resumes(tmp_path):
    """The tiny default with lora_rank=8 through torchrun: the run ends, its final checkpoint is a plain HF model with
    adapters.pth beside it, and resume=auto continues from it to more steps."""
    out = str(tmp_path / "run")
    rows, summary = torchrun(["lora_rank=8", "lr=1e-3", "steps=6", "eval_every=0", "n_test=50", "initial_buffer=16",
                              "time_budget_min=0"], out)
    assert summary["steps"] == 6 and all(r["train/skipped"] == 0 for r in rows[1:])
    final = os.path.join(out, "checkpoints", "final")
    assert os.path.isfile(os.path.join(final, lora.ADAPTERS))
    assert not any(lora.is_adapter(n) for n, _ in load_model(final, "float32", "cpu").named_parameters())
    rows, summary = torchrun(["lora_rank=8", "lr=1e-3", "steps=8", "eval_every=0", "n_test=50", "initial_buffer=16",
                              "time_budget_min=0", "resume=auto"], out)
    assert summary["steps"] == 8 and [r["step"] for r in read_run(out)[0]][-2:] == [7, 8]
