"""LoRA through peft (learner.lora_model): the adapters are all that trains, float32 whatever the base's dtype, the
policy starts as the base model, and what leaves the trainer (the weight push, the checkpoint's Hugging Face files) is
the merged policy that a plain model reproduces; the checkpoint's adapter files load with PeftModel.from_pretrained."""
import dataclasses
import json
import os
import types

import pytest
import torch

import checkpoint
import transport
from config import ConfigError, load_config
from conftest import ROOT, read_run, torchrun
from learner import Learner, checkpointing, lora_model, policy_model
from policy import base_weights, load_model, load_tokenizer, merged_weights, token_logprobs
from test_trainer_group import FakeGroup, random_batch
from policy import decoder_layers

PROMPTS, RESPONSES = [[1, 5, 6, 7], [1, 9, 8]], [[10, 11, 12], [13, 14]]


def tiny_cfg(**kw):
    return dataclasses.replace(load_config(os.path.join(ROOT, "configs", "tiny.yaml")), B=2, K=4, **kw)


def trained(tiny_model, steps=2, **kw):
    """A LoRA learner on the tiny model after `steps` updates on a random batch (lr 1e-2: the adapters move)."""
    cfg = tiny_cfg(**{"lora_rank": 4, "lr": 1e-2, **kw})
    prompts, items, totals = random_batch(cfg, seed=0, rewards=3)
    model = checkpointing(policy_model(cfg, None, "cpu").train(), cfg)
    learner = Learner(cfg, None, prompts, model, FakeGroup(model))
    for step in range(1, steps + 1):
        assert learner.optimizer_step(items, totals, step).finite
    return cfg, learner


def adapters(model):
    return {n: p for n, p in model.named_parameters() if ".lora_" in n}


def test_the_adapted_policy_starts_as_the_base_and_only_adapters_train(tiny_model):
    base = load_model(tiny_model, "float32", "cpu")
    before = {n: p.clone() for n, p in base.named_parameters()}
    model = lora_model(load_model(tiny_model, "float32", "cpu"), tiny_cfg(lora_rank=4, lora_alpha=8.0))
    adapted = {n.removeprefix("base_model.model.").rsplit(".lora_", 1)[0] for n in adapters(model)}
    decoder_linears = {f"{name}.{child}" for name, block in base.named_modules() if block in decoder_layers(base)
                       for child, m in block.named_modules() if isinstance(m, torch.nn.Linear)}
    assert len(adapters(model)) == 2 * 7 * 2 and adapted == decoder_linears  # q..down of the 2 blocks: A and B
    torch.testing.assert_close(token_logprobs(model, PROMPTS, RESPONSES, 1.0)[0],
                               token_logprobs(base, PROMPTS, RESPONSES, 1.0)[0], rtol=0, atol=0)  # B = 0
    cfg, learner = trained(tiny_model)
    assert {id(p) for g in learner.opt.param_groups for p in g["params"]} == \
        {id(p) for p in adapters(learner.model).values()}
    frozen = base_weights(learner.model)  # the base model's weights under its own names
    assert frozen.keys() == before.keys() and all(torch.equal(p, before[n]) for n, p in frozen.items())
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in adapters(learner.model).items() if "lora_B" in n)


def test_activation_checkpointing_trains_the_adapters_as_without(tiny_model):
    """grad_checkpointing with frozen base weights: the recompute gives the adapters the gradients they get without
    it, so the two learners end the same."""
    _, plain = trained(tiny_model)
    _, ckpt = trained(tiny_model, grad_checkpointing=True)
    assert ckpt.model.is_gradient_checkpointing
    for n, p in adapters(ckpt.model).items():
        torch.testing.assert_close(p, adapters(plain.model)[n], rtol=1e-5, atol=1e-6)
    assert any(not torch.equal(p, torch.zeros_like(p)) for n, p in adapters(ckpt.model).items() if "lora_B" in n)


def test_adapters_stay_float32_and_move_on_a_bfloat16_base(tiny_model):
    """configs/math_tba_prime_lora.yaml's case: a bfloat16 base at lr 1e-5. The adapters and their AdamW states are
    float32, so every entry of A and B moves (a bfloat16 A would not: a step is below half its ulp); the pushed
    weights are W + s B A computed in float32 from the untouched base and rounded once, and they change."""
    cfg, learner = trained(tiny_model, steps=0, dtype="bfloat16", lr=1e-5)
    model = learner.model
    start = {n: p.detach().clone() for n, p in adapters(model).items()}
    base = {n: t.clone() for n, t in merged_weights(model).items()}
    prompts, items, totals = random_batch(cfg, seed=0, rewards=3)
    for step in range(1, 4):
        assert learner.optimizer_step(items, totals, step).finite
    assert all(p.dtype == torch.float32 for p in adapters(model).values())
    assert all(v.dtype == torch.float32 for state in learner.opt.state.values() for v in state.values())
    for n, p in adapters(model).items():  # A's first step has no gradient (B = 0): two steps since
        assert bool((p != start[n]).all()), f"{n}: {(p == start[n]).float().mean():.0%} of the entries never moved"
    pushed = transport.WeightTransport(types.SimpleNamespace(rank=0, broadcast_object=lambda meta: meta,
                                                             new_gloo_group=lambda name: None),
                                       "gloo", "bfloat16", 1, "cpu", model).params
    layer = model.get_base_model().model.layers[0].self_attn.q_proj
    name = "model.layers.0.self_attn.q_proj.weight"
    assert torch.equal(layer.base_layer.weight, base[name])  # never merged in place
    delta = layer.lora_B["default"].weight @ layer.lora_A["default"].weight * layer.scaling["default"]
    assert pushed[name].dtype == torch.bfloat16
    assert torch.equal(pushed[name], (base[name].float() + delta).to(torch.bfloat16))
    assert not torch.equal(pushed[name], base[name])


def test_the_merged_weights_are_the_adapted_policy(tiny_model):
    """A plain model loaded with merged_weights gives the adapted model's log-probs; the push's names are the base
    model's, without the adapters."""
    cfg, learner = trained(tiny_model)
    model = learner.model.eval()
    plain = load_model(tiny_model, "float32", "cpu")
    merged = merged_weights(model, buffers=True)
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


def test_a_checkpoint_holds_peft_adapters_beside_the_merged_policy_and_resume_restores_them(tiny_model, tmp_path):
    """The HF files are the merged policy, and transformers loads them without the adapters; the adapter/ folder's
    adapter_config.json + adapter_model.safetensors load with PeftModel.from_pretrained onto the base and give the
    merged model's logits; meta.json lists them (a torn adapter file is seen); resume restores the adapters exactly."""
    from peft import PeftModel
    cfg, learner = trained(tiny_model)
    model = learner.model.eval()
    path = str(tmp_path / "step_2")
    checkpoint.save(path, model, load_tokenizer(tiny_model), dict(meta={}, step=2, places={}, ref_weights=None))
    assert {"adapter/adapter_config.json", "adapter/adapter_model.safetensors", "model.safetensors"} <= \
        set(checkpoint.meta(path)["files"])
    assert json.load(open(os.path.join(path, "adapter", "adapter_config.json")))["r"] == 4
    saved = load_model(path, "float32", "cpu")  # eval.py / vLLM: a plain HF checkpoint
    assert set(saved.state_dict()) == set(load_model(tiny_model, "float32", "cpu").state_dict())
    peft = PeftModel.from_pretrained(load_model(tiny_model, "float32", "cpu"), os.path.join(path, "adapter")).eval()
    ids = torch.tensor([PROMPTS[0] + RESPONSES[0]])
    with torch.no_grad():
        torch.testing.assert_close(peft(input_ids=ids).logits, saved(input_ids=ids).logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(peft(input_ids=ids).logits, model(input_ids=ids).logits, rtol=0, atol=0)
    resumed = policy_model(cfg, path, "cpu")  # the base model plus the checkpoint's adapters, trainable
    assert [n for n, p in resumed.named_parameters() if p.requires_grad] == list(adapters(model))
    for (n, a), (m, b) in zip(resumed.named_parameters(), model.named_parameters()):
        assert n == m and torch.equal(a, b)
    with pytest.raises(Exception, match="does not fit lora_rank=2"):
        policy_model(dataclasses.replace(cfg, lora_rank=2), path, "cpu")
    with open(os.path.join(path, "adapter", "adapter_model.safetensors"), "ab") as f:
        f.write(b"torn")
    assert checkpoint.torn(path) == "adapter/adapter_model.safetensors has {} of {} bytes".format(
        *[os.path.getsize(f.name), os.path.getsize(f.name) - 4])


def test_a_resume_with_another_lora_alpha_is_refused_in_one_line(tiny_model, tmp_path):
    """The saved adapters learned B A for the scale alpha / r they were trained with; a resume with another
    lora_alpha would rescale that update (peft takes the resumed run's config), so it is refused in one line naming
    the key, also for a checkpoint whose meta.json predates the key (its adapter_config.json says)."""
    cfg, learner = trained(tiny_model, lora_alpha=8.0)
    path = tmp_path / "run" / "checkpoints" / "step_2"
    state = dict(meta=checkpoint.contract(cfg), step=2, places={}, ref_weights=None)
    checkpoint.save(str(path), learner.model, load_tokenizer(tiny_model), state)
    base = dict(out_dir=str(tmp_path / "run"), resume="auto", steps=4)
    assert checkpoint.find_resume(dataclasses.replace(cfg, **base)) == str(path)
    meta = json.loads((path / "meta.json").read_text())
    for older in (False, True):
        if older:  # meta.json as written before lora_alpha was recorded
            del meta["lora_alpha"]
            (path / "meta.json").write_text(json.dumps(meta))
        for alpha, written in [(16.0, "8.0"), (0.0, "8.0")]:  # 0: alpha = lora_rank = 4
            with pytest.raises(ConfigError, match=f"written with lora_alpha={written}; resume with that, not "
                                                  f"lora_alpha={alpha or 4}") as e:
                checkpoint.find_resume(dataclasses.replace(cfg, lora_alpha=alpha, **base))
            assert "\n" not in str(e.value)
    assert checkpoint.find_resume(dataclasses.replace(cfg, **base)) == str(path)


def test_resume_refuses_adapters_of_the_old_format_in_one_line(tmp_path):
    """A checkpoint of the format before peft (adapters.pth, no format in meta.json): resume says so in one line before
    any process starts."""
    path = tmp_path / "run" / "checkpoints" / "step_2"
    path.mkdir(parents=True)
    (path / "adapters.pth").write_bytes(b"old")
    (path / "meta.json").write_text(json.dumps({"step": 2, "weight_delay": 0, "lora_rank": 4, "files": {}}))
    cfg = tiny_cfg(lora_rank=4, steps=4, out_dir=str(tmp_path / "run"), resume="auto")
    with pytest.raises(ConfigError, match=f"written by an older version of this code .format 1, this one reads "
                                          f"{checkpoint.FORMAT}.; start another out_dir, from its weights with model=") as e:
        checkpoint.find_resume(cfg)
    assert "\n" not in str(e.value)


def test_lora_refuses_what_it_cannot_do_in_one_line():
    for overrides, message in [(["lora_rank=4", "weight_delay=1"], "lora_rank with weight_delay"),
                               (["lora_rank=4", "n_trainers=2", "B=4", "trainer_parallel=fsdp"],
                                "needs trainer_parallel=ddp")]:
        with pytest.raises(ConfigError, match=message):
            load_config(os.path.join(ROOT, "configs", "tiny.yaml"), overrides)


def test_a_lora_run_learns_saves_merged_weights_and_resumes(tmp_path):
    """The tiny default with lora_rank=8 through torchrun: the run ends, its final checkpoint is a plain HF model with
    peft's adapter files beside it, and resume=auto continues from it to more steps."""
    out = str(tmp_path / "run")
    rows, summary = torchrun(["lora_rank=8", "lr=1e-3", "steps=6", "eval_every=0", "n_test=50", "initial_buffer=16",
                              "time_budget_min=0"], out)
    assert summary["steps"] == 6 and all(r["train/skipped"] == 0 for r in rows[1:])
    final = os.path.join(out, "checkpoints", "final")
    assert os.path.isfile(os.path.join(final, "adapter", "adapter_model.safetensors"))
    assert not any(".lora_" in n for n in load_model(final, "float32", "cpu").state_dict())
    rows, summary = torchrun(["lora_rank=8", "lr=1e-3", "steps=8", "eval_every=0", "n_test=50", "initial_buffer=16",
                              "time_budget_min=0", "resume=auto"], out)
    assert summary["steps"] == 8 and [r["step"] for r in read_run(out)[0]][-2:] == [7, 8]
