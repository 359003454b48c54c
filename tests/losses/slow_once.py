"""A slow step (loss=tests/losses/slow_once.py): TB, except that the first call after the file $SLOW_STEP appears
writes $SLOW_STEP.started and sleeps SLOW_SECONDS (default 40: longer than torchrun's own 30 s grace from SIGTERM to
SIGKILL), as a 7B step would; tests/test_resilience.py signals the job while it sleeps."""
import os
import time

from losses import LOSSES


def loss(batch, cfg):
    marker = os.environ.get("SLOW_STEP", "")
    if marker and os.path.exists(marker) and not os.path.exists(marker + ".started"):
        open(marker + ".started", "w").close()
        time.sleep(float(os.environ.get("SLOW_SECONDS", "40")))
    return LOSSES["tb"](batch, cfg)
