"""A user's own loss, in a file of its own (loss=tests/losses/reinforce.py): REINFORCE with the group-mean reward as
its baseline. Nothing else in the codebase knows about it."""
from losses import group_mean, masked


def loss(batch, cfg):
    mask = batch["mask"]
    seq_logp = masked(batch["logp"], mask).sum(1)
    adv = batch["reward"] - group_mean(batch["reward"], batch["group"])
    return -(adv * seq_logp).mean(), {"adv_abs_mean": adv.abs().mean().item()}
