"""Build the tiny arith model: a word-level tokenizer and a 2-layer Llama warm-started by SFT (docs/results.md).

    python scripts/make_tiny.py --out assets/tiny-arith/sft [--seed 0] [--target 0.45]

SFT (cross-entropy on solution tokens + eos) on rewards/arith's train split stops when greedy accuracy on the dev split
first reaches --target; RL then has room to improve. The folder is built in <out>.tmp and renamed when complete; an
existing <out> is left alone. <out>/tiny_info.json records seed, steps, SFT seconds and dev / test greedy accuracy.
Same seed and machine, same weights (fixed thread count, deterministic data order); another machine may stop at
another step with other weights (floating-point details), which is why the repository ships the model it made
(assets/README.md) and runs load that.
"""
import argparse
import json
import os
import re
import shutil
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # import rewards/ from the repo root

from rewards import arith

SPECIALS = ["<unk>", "<s>", "</s>", "<pad>"]
# One piece per word, single digit or punctuation mark, each with its leading space if any, and each newline alone.
# The decoder just concatenates pieces, so decode(encode(text)) == text for every text made of known pieces.
PIECE = r" ?[A-Za-z]+| ?[0-9]| ?#+| ?[^\sA-Za-z0-9]|\s"


def build_tokenizer(out_dir=None, texts=None):
    """Word-level tokenizer over every piece arith text (or `texts`) can contain; saved to out_dir when given."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    if texts is None:  # every template with every name, item and container, plus all digits and operators
        texts = [arith.PROMPT.format(question=t.format(n=n, i=i, c=c, a=1, b=2, d=3)) for ts in arith.TEMPLATES.values()
                 for t in ts for n in arith.NAMES for i in arith.ITEMS for c in arith.CONTAINERS]
        texts += [f"{x}{y} {op} {x} = {y}. #### {y}" for x in range(10) for y in range(10) for op in "+-*"]
    pieces = sorted({p for t in texts for p in re.findall(PIECE, t)})
    vocab = {p: i for i, p in enumerate(SPECIALS + pieces)}

    tk = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.Split(Regex(PIECE), behavior="isolated")
    tk.decoder = decoders.Fuse()
    tk.post_processor = processors.TemplateProcessing(single="<s> $A", pair="<s> $A $B", special_tokens=[("<s>", vocab["<s>"])])
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
                                  pad_token="<pad>", clean_up_tokenization_spaces=False)
    if out_dir:
        tok.save_pretrained(out_dir)
    return tok


def greedy_accuracy(model, tok, records, max_new_tokens=24, batch_size=250):
    """Fraction of records whose greedy completion gets reward 1 (batched HF generate, left padding)."""
    import torch
    model.eval()
    correct = 0
    with torch.no_grad():
        for s in range(0, len(records), batch_size):
            batch = records[s:s + batch_size]
            enc = tok([r["prompt"] for r in batch], return_tensors="pt", padding=True, padding_side="left")
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                                 pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
            texts = tok.batch_decode(out[:, enc["input_ids"].shape[1]:], skip_special_tokens=True)
            correct += sum(arith.reward(t, r["answer"]) for t, r in zip(texts, batch))
    return correct / len(records)


def build_model(tok, seed):
    """Random-init Llama: hidden 128, 2 layers, 4 heads of 32 (vLLM's CPU attention needs head_dim >= 32)."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=4, head_dim=32, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                                               pad_token_id=tok.pad_token_id)
    return model


def sft(model, tok, train, dev, seed, target, lr=1e-3, batch_size=64, max_steps=3000, log=print):
    """Cross-entropy on solution + eos tokens (prompt masked) until dev greedy accuracy first reaches `target`.
    Evaluates every 25 steps, every 5 once within 0.1 of the target. Returns (steps, dev accuracy)."""
    import torch
    prompts = tok([r["prompt"] for r in train])["input_ids"]  # <s> prompt
    answers = tok([r["answer"] for r in train], add_special_tokens=False)["input_ids"]
    seqs = [p + a + [tok.eos_token_id] for p, a in zip(prompts, answers)]

    def batch(idx):
        T = max(len(seqs[i]) for i in idx)
        x = torch.full((len(idx), T), tok.pad_token_id)
        y = torch.full((len(idx), T), -100)
        for row, i in enumerate(idx):
            s, n = torch.tensor(seqs[i]), len(prompts[i])
            x[row, :len(s)] = s
            y[row, n:len(s)] = s[n:]  # loss on solution + eos only
        return x, y

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    g = torch.Generator().manual_seed(seed)
    order, pos, step, acc, near, t0 = torch.randperm(len(seqs), generator=g), 0, 0, 0.0, False, time.time()
    while step < max_steps:
        if pos + batch_size > len(order):  # next epoch
            order, pos = torch.randperm(len(seqs), generator=g), 0
        x, y = batch(order[pos:pos + batch_size].tolist())
        pos += batch_size
        model.train()
        loss = model(input_ids=x, labels=y).loss  # right padding + causal attention: no mask needed
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        step += 1
        if step % (5 if near else 25) == 0:
            acc = greedy_accuracy(model, tok, dev)
            near = near or acc >= target - 0.1
            log(f"step {step}: loss {loss.item():.3f} dev {acc:.3f} ({time.time() - t0:.0f}s)")
            if acc >= target:
                break
    return step, acc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="assets/tiny-arith/sft")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target", type=float, default=0.45, help="stop SFT when dev greedy accuracy first reaches this")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the weights depend on it; keep it fixed)")
    args = ap.parse_args()
    out = args.out.rstrip("/")
    if os.path.exists(out):
        print(f"{out} exists; nothing to do")
        return

    import torch
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tok = build_tokenizer(tmp)
    model = build_model(tok, args.seed)
    print(f"model: {sum(p.numel() for p in model.parameters()):,} params, vocab {len(tok)}")

    t0 = time.time()
    train, dev = arith.load(arith.DEFAULT_TRAIN, "train"), arith.load("procedural:dev:300", "dev")
    steps, dev_acc = sft(model, tok, train, dev, args.seed, args.target, lr=args.lr, log=lambda m: print(m, flush=True))
    sft_s = time.time() - t0
    test_acc = greedy_accuracy(model, tok, arith.load(arith.DEFAULT_TEST, "test"), max_new_tokens=24)
    print(f"SFT: {steps} steps, {sft_s:.0f}s, dev {dev_acc:.3f}, test {test_acc:.3f}")

    model.save_pretrained(tmp)  # float32 safetensors
    info = dict(seed=args.seed, steps=steps, sft_seconds=round(sft_s, 1), target=args.target, lr=args.lr,
                threads=args.threads, dev_greedy_acc=dev_acc, test_greedy_acc=test_acc, max_new_tokens=24)
    with open(os.path.join(tmp, "tiny_info.json"), "w") as f:
        json.dump(info, f, indent=1)
    os.replace(tmp, out)  # complete folder appears at once
    print(f"saved {out}")


if __name__ == "__main__":
    main()
