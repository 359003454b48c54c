"""A loss with a bug (loss=tests/losses/fails_at_step_3.py): TB until its step-3 call, then an IndexError, as a bad
sample or an indexing mistake would raise mid-run (tests/test_resilience.py)."""
from losses import LOSSES


def loss(batch, cfg):
    if batch["beta"] and loss.calls == 2:
        raise IndexError("index 8 is out of bounds for dimension 0 with size 8")
    loss.calls += 1
    return LOSSES["tb"](batch, cfg)


loss.calls = 0
