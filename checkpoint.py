"""Resumable checkpoints, each written whole or not at all, and the contract a resume must keep (its meta.json).

    out_dir/checkpoints/step_N/   (and final/ at the end of a run)
        model.safetensors, config.json, tokenizer files   HF format: eval.py, transformers and vLLM load it as is
        trainer_state.pth   trainer.TrainerState.state_dict(): step, optimizer, replay buffer, RNG, counters
        searchers.pth       {rank: sync.ShardPlace}: each searcher's place in its prompt shard and its RNG states,
                            as of the last sync round (each searcher reads its own)
        adapter/            lora_rank > 0: peft's LoRA adapters, float32 (adapter_config.json,
                            adapter_model.safetensors; the HF files hold the merged weights):
                            PeftModel.from_pretrained(base, "step_N/adapter") and vLLM's LoRA support load them, and so
                            does resume, on top of the base model. In a folder of their own: transformers'
                            from_pretrained of a folder with adapter_config.json would add them to the merged weights
        ref.pth             the reference policy, when TBA' has reset it (ref_reset_every > 0; searchers read it)
        optimizer_rank{r}.pt  n_trainers > 1: each trainer rank's own optimizer state (fsdp: its shard), in place of
                            trainer_state.pth's; a resume needs the same n_trainers and trainer_parallel (meta.json)
        meta.json           {"step": N, the resume contract (contract(): format, weight_delay, lora_rank, the data
                            the buffer was filled from, with n_trainers > 1 n_trainers and trainer_parallel),
                            "files": {name: bytes} of every other file}, written last

A checkpoint is written into NAME.tmp/, every file flushed to disk (fsync), and renamed to NAME when complete, so a
crash in the middle of a save leaves every earlier checkpoint intact. `latest` takes the newest checkpoint whose files
all have the sizes meta.json lists (a node crash can leave a renamed folder with a torn file) and says which it
skipped; `prune` also removes the *.tmp folders of saves that never finished, torn checkpoints and those past the
step just saved.
"""
import json
import os
import re
import shutil
import sys

import torch

from config import ConfigError
from policy import is_lora, merged_weights

STEP_DIR = re.compile(r"step_(\d+)$")
ADAPTERS = "adapter"  # the folder of peft's adapter files in a checkpoint (lora_rank > 0)


BUFFER_KEYS = ("task", "train_data", "n_train", "model", "K", "S")  # what the buffered samples were made with
FORMAT = 2  # of the files below; 2: peft's adapter folder, the buffer's recent pool spanning rounds, version spans


# ---------------------------------------------------------------- the resume contract: written here, checked here


def contract(cfg):
    """What meta.json records for a resume to match (find_resume): the format, weight_delay (the kept weight versions
    are its own), lora_rank (adapters on the base model, or whole weights) and with it lora_alpha (the adapters' scale:
    another would rescale the update they learned), the data the buffer was filled from, and with n_trainers > 1 the
    layout of the per-rank optimizer files."""
    written = {"format": FORMAT, "weight_delay": cfg.weight_delay, "lora_rank": cfg.lora_rank,
               "buffer_keys": {k: getattr(cfg, k) for k in BUFFER_KEYS}}
    if cfg.lora_rank:
        written["lora_alpha"] = cfg.lora_alpha or cfg.lora_rank  # 0 means lora_rank
    if cfg.n_trainers > 1:
        written.update(n_trainers=cfg.n_trainers, trainer_parallel=cfg.trainer_parallel)
    return written


def adapter_alpha(path):
    """The lora_alpha in a checkpoint's adapter/adapter_config.json (peft's), None when it has none."""
    try:
        with open(os.path.join(path, ADAPTERS, "adapter_config.json")) as f:
            return json.load(f).get("lora_alpha")
    except (OSError, ValueError):
        return None


def layout(found):
    """'n_trainers=T[ trainer_parallel=P]' of a contract."""
    return f"n_trainers={found.get('n_trainers', 1)}" + (
        f" trainer_parallel={found['trainer_parallel']}" if "trainer_parallel" in found else "")


def find_resume(cfg):
    """The checkpoint dir to continue from (resume=auto: the newest complete one in out_dir, None if there is none),
    checked against the contract the run would write: a mismatch is one ConfigError line."""
    if not cfg.resume:
        return None
    warn = os.environ.get("RANK") == "0"  # the job's rank 0 says which torn checkpoint it skipped
    path = latest(os.path.join(cfg.out_dir, "checkpoints"), warn) if cfg.resume == "auto" else cfg.resume
    if path is None:
        return None
    why = torn(path)
    if why:
        raise ConfigError(f"resume={cfg.resume}: {path} is not a complete checkpoint ({why})")
    found, wanted = meta(path), contract(cfg)
    if found.get("format", 1) != FORMAT:
        raise ConfigError(f"resume: {path} was written by an older version of this code (format "
                          f"{found.get('format', 1)}, this one reads {FORMAT}); start another out_dir, from its weights "
                          f"with model={path} if you like")
    if found["step"] >= cfg.steps:
        raise ConfigError(f"resume: {path} is at step {found['step']} and steps={cfg.steps}; raise steps to continue")
    if wanted["lora_rank"] and "lora_alpha" not in found:  # written before meta.json recorded it: the adapters' own
        found["lora_alpha"] = adapter_alpha(path)
    for key in ("weight_delay", "lora_rank", "lora_alpha"):
        if found.get(key) != wanted.get(key):
            raise ConfigError(f"resume: {path} was written with {key}={found.get(key)}; resume with that, not "
                              f"{key}={wanted.get(key)}")
    for key, value in found["buffer_keys"].items():  # its buffer: prompt ids and samples of that data
        if getattr(cfg, key) != value:
            raise ConfigError(f"resume: {path} was written with {key}={value}, and its replay buffer holds that run's "
                              f"prompts and samples; resume with {key}={value}, not {getattr(cfg, key)}, or start "
                              "another out_dir")
    if layout(found) != layout(wanted):  # one optimizer file per trainer rank
        raise ConfigError(f"resume: {path} was written with {layout(found)}; resume with that, not {layout(wanted)}")
    return path


# ---------------------------------------------------------------- writing and finding checkpoints


def save(path, model, tok, state, shards=None):
    """The weights and tokenizer in HF format and `state` (the trainer's state_dict, with the searchers' `places` and
    TBA's `ref_weights` in files of their own). shards(tmp), n_trainers > 1: every trainer rank writes its optimizer
    state into the checkpoint being written; returns the whole weights for the HF files (None: the model's own)."""
    from transformers.utils import logging
    logging.disable_progress_bar()  # no "Writing model shards" bar in the run's log
    tmp = path + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    weights = None
    os.makedirs(tmp)
    if shards is not None:
        weights = shards(tmp)
    if is_lora(model):  # peft's adapter files (resume loads them); the HF files hold the merged policy (eval.py, vLLM)
        model.save_pretrained(os.path.join(tmp, ADAPTERS))
        weights = {n: t.detach().to("cpu", copy=True) for n, t in merged_weights(model, buffers=True).items()}
        model = model.get_base_model()
    model.save_pretrained(tmp, state_dict=weights)
    tok.save_pretrained(tmp)
    state = dict(state)
    places, ref_weights = state.pop("places"), state.pop("ref_weights")
    torch.save(state, os.path.join(tmp, "trainer_state.pth"))
    torch.save(places, os.path.join(tmp, "searchers.pth"))
    if ref_weights is not None:
        torch.save(ref_weights, os.path.join(tmp, "ref.pth"))
    files = {os.path.relpath(os.path.join(folder, name), tmp): os.path.getsize(os.path.join(folder, name))
             for folder, _, names in sorted(os.walk(tmp)) for name in sorted(names)}
    with open(os.path.join(tmp, "meta.json"), "w") as f:
        json.dump({"step": state["step"], **state.get("meta", {}), "files": files}, f)
    for folder, _, names in os.walk(tmp, topdown=False):  # each folder after what it holds
        for name in names:
            sync_to_disk(os.path.join(folder, name))
        sync_to_disk(folder)
    shutil.rmtree(path, ignore_errors=True)  # re-saving the same step (a resumed run): the old copy goes last
    os.replace(tmp, path)
    sync_to_disk(os.path.dirname(path) or ".")  # the rename itself


def sync_to_disk(path):
    """fsync a file or a directory (its entries), so what it holds survives a crash of the machine."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def torn(path):
    """Why the checkpoint at `path` cannot be used (a missing meta.json, a file missing or of another size than
    meta.json lists), or None when it is complete. Checkpoints whose meta.json lists no files are taken as they are."""
    found = meta(path)
    if not found:
        return "no meta.json"
    for name, size in found.get("files", {}).items():
        file = os.path.join(path, name)
        if not os.path.isfile(file):
            return f"{name} is missing"
        if os.path.getsize(file) != size:
            return f"{name} has {os.path.getsize(file)} of {size} bytes"
    return None


def meta(path):
    """A complete checkpoint's meta.json ({"step": N, and the settings a resume must keep}), or {} when `path` is
    not one."""
    try:
        with open(os.path.join(path, "meta.json")) as f:
            found = json.load(f)
        return dict(found, step=int(found["step"]))
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def step_of(path):
    """The step a complete checkpoint holds, or None when `path` is not one."""
    return meta(path).get("step")


def latest(ckpt_dir, warn=False):
    """The newest complete checkpoint under ckpt_dir (highest step; final/ wins a tie), or None. A newer one that is
    torn is skipped (`warn`: with a warning line naming it)."""
    if not os.path.isdir(ckpt_dir):
        return None
    found = [(step_of(p), name == "final", p) for name in os.listdir(ckpt_dir)
             if not name.endswith(".tmp") for p in [os.path.join(ckpt_dir, name)]]
    for _, _, path in sorted((f for f in found if f[0] is not None), reverse=True):
        why = torn(path)
        if why is None:
            return path
        if warn:
            print(f"warning: skipping the torn checkpoint {path} ({why})", file=sys.stderr, flush=True)
    return None


def prune(ckpt_dir, keep, step):
    """After the save of `step`: delete the *.tmp folders of saves that never finished, the step_N checkpoints that
    are torn or past `step` (a resume from an earlier one redoes those steps: resume=auto must never take them), and
    all but the newest `keep` of the others (final/ is never deleted; keep 0 = keep all). Called by the one job that
    writes into ckpt_dir."""
    good = []
    for name in os.listdir(ckpt_dir):
        path, m = os.path.join(ckpt_dir, name), STEP_DIR.match(name)
        if name.endswith(".tmp") or m and (int(m.group(1)) > step or torn(path)):
            shutil.rmtree(path, ignore_errors=True)
        elif m:
            good.append((int(m.group(1)), path))
    for _, path in sorted(good)[:-keep] if keep > 0 else []:
        shutil.rmtree(path, ignore_errors=True)


def run_in(out_dir):
    """What a run left in out_dir, in a few words ("" when nothing): its summary's steps, or the steps its
    metrics.jsonl logged, and its complete checkpoints."""
    found = []
    if os.path.isfile(os.path.join(out_dir, "summary.json")):
        with open(os.path.join(out_dir, "summary.json")) as f:
            found.append(f"a finished run of {json.load(f).get('steps', '?')} steps")
    elif os.path.isfile(os.path.join(out_dir, "metrics.jsonl")):
        with open(os.path.join(out_dir, "metrics.jsonl")) as f:
            found.append(f"metrics.jsonl with {sum(1 for line in f if line.strip())} rows")
    ckpt_dir = os.path.join(out_dir, "checkpoints")
    names = sorted(n for n in os.listdir(ckpt_dir) if step_of(os.path.join(ckpt_dir, n)) is not None) \
        if os.path.isdir(ckpt_dir) else []
    if names:
        found.append("checkpoints " + ", ".join(names))
    return "; ".join(found)


def clear_run(out_dir, restart=False):
    """Delete what a run writes into out_dir (and nothing else there). `restart`: this job's restart with no complete
    checkpoint to resume from clears what its failed attempt wrote but the logs (runlog.Logger keeps metrics.jsonl as
    metrics.lost.K.jsonl) and checkpoints/ (torn or unfinished saves at most: prune deletes them)."""
    for name in os.listdir(out_dir) if os.path.isdir(out_dir) else []:
        path = os.path.join(out_dir, name)
        log = name == "metrics.jsonl" or re.fullmatch(r"metrics\.lost\.\d+\.jsonl", name)
        if os.path.isdir(path) and (name == "tb" or name == "checkpoints" and not restart):
            shutil.rmtree(path)
        elif name in ("config.yaml", "summary.json", "sync_probe.jsonl") or re.fullmatch(r"eval_step\d+\.jsonl", name) \
                or log and not restart:
            os.remove(path)


def load_state(path):
    """What save() was given as `state`."""
    return dict(load(path, "trainer_state.pth"), places=load(path, "searchers.pth"), ref_weights=load(path, "ref.pth"))


def load(path, name):
    """One of the state files of a checkpoint (None when it has none: ref.pth exists only after a reset)."""
    file = os.path.join(path, name)
    return torch.load(file, weights_only=False) if os.path.isfile(file) else None
