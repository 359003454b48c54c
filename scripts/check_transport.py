"""Check and time the weight transport on its own: rank 0 pushes a random model's weights, every other rank pulls them
into its own copy (initialised with another seed), loads them and verifies them bit for bit against rank 0.

    torchrun --nproc_per_node=3 scripts/check_transport.py                          # CPU: gloo, tiny Llama
    torchrun --nproc_per_node=2 scripts/check_transport.py --shape tinyllama        # 1 GPU: ipc, 1.1B in bf16
    torchrun --nproc_per_node=3 scripts/check_transport.py --overlap                # push_overlap: rank 0 changes
                                                                                    # its weights during the broadcast
"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import train  # noqa: E402  (pins this rank's GPU before torch initialises CUDA)
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from comm import Comm  # noqa: E402
from transport import WeightTransport, pick_transport  # noqa: E402

SHAPES = {  # TinyLlama-1.1B is the shape of the GSM8K anchor checkpoint (rho-1b)
    "tiny": dict(vocab_size=128, hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=4, head_dim=32),
    "small": dict(vocab_size=4096, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                  num_key_value_heads=8),  # 27 MB in float32: many 1 MB buckets through two buffers
    "tinyllama": dict(vocab_size=32000, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                      num_attention_heads=32, num_key_value_heads=4),
}

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="tiny", choices=list(SHAPES))
ap.add_argument("--transport", default="auto")
ap.add_argument("--dtype", default=None)
ap.add_argument("--bucket-mb", type=int, default=256)
ap.add_argument("--pushes", type=int, default=5)
ap.add_argument("--overlap", action="store_true", help="push_overlap (gloo / nccl)")
ap.add_argument("--busy-seconds", type=float, default=0.0,
                help="rank 0 computes this long after each push (a train step); the JSON gets the loop's seconds")
ap.add_argument("--json", default="")
args = ap.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
dtype = args.dtype or ("bfloat16" if device == "cuda" else "float32")
comm = Comm(600)
torch.manual_seed(comm.rank)  # every rank starts from different weights
with torch.device(device):
    model = LlamaForCausalLM(LlamaConfig(**SHAPES[args.shape], tie_word_embeddings=False)).to(getattr(torch, dtype))
kind = pick_transport(args.transport, device, train.gpu_mode(device, train.LOCAL_WORLD), overlap=args.overlap)
wt = WeightTransport(comm, kind, dtype, args.bucket_mb, device, model if comm.rank == 0 else None, args.overlap)


def digest():
    with torch.no_grad():
        return [float(p.double().sum()) for p in model.parameters()]


def busy(seconds):
    """A stand-in for the train step after a push: matrix products on rank 0 for `seconds`."""
    a, end = torch.randn(256, 256, device=device), time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = torch.tanh(a @ a)
        if device == "cuda":
            torch.cuda.synchronize()


params = dict(model.named_parameters())
times = []
t_loop = time.perf_counter()
for i in range(args.pushes):
    if comm.rank == 0:
        with torch.no_grad():
            for p in model.parameters():
                p.add_(0.01)  # new weights every push
        sent = digest()
        times.append(wt.push())
        with torch.no_grad():  # the next train step, with push_overlap while the broadcast may still be running:
            for p in model.parameters():  # it must not reach the searchers
                p.mul_(-1.0)
        busy(args.busy_seconds)
    else:
        t0 = time.perf_counter()
        named, done = wt.pull()
        with torch.no_grad():
            for name, t in named:
                params[name].copy_(t)
        done()
        times.append(time.perf_counter() - t0)
    digests = comm.gather_object(sent if comm.rank == 0 else digest())  # waits for a broadcast that outlasts busy
    if comm.rank == 0:
        assert all(d == digests[0] for d in digests), f"push {i}: weights differ after the transport"
loop = time.perf_counter() - t_loop  # pushes, busy time and the broadcasts that outlasted it
if comm.rank == 0:
    n = sum(p.numel() for p in model.parameters())
    res = {"transport": kind, "device": device, "dtype": dtype, "params": n, "bytes": wt.bytes,
           "buckets": len(wt.buckets), "overlap": wt.overlap, "push_seconds": times,
           "push_seconds_median": sorted(times)[len(times) // 2], "busy_seconds": args.busy_seconds,
           "loop_seconds": loop, "verified": True}
    print(json.dumps(res))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(res, f, indent=2)
comm.barrier()
wt.close()
sys.stdout.flush()
os._exit(0)  # checked and verified: skip the interpreter's teardown, whose gloo threads can abort a rank (SIGABRT)
