# SPDX-License-Identifier: Apache-2.0
"""PyTorch baselines of bench_data_parallel: the MLP of example 01 (784-1024-1024-10, ReLU,
dropout 0.1), SGD with Nesterov momentum, at a global batch of 256 on CPU, either

  python3 torch_ddp.py --mode ddp --ranks 2      # DistributedDataParallel, gloo, 1 thread each
  python3 torch_ddp.py --mode single --threads 2 # one process, intra-op threads

Inputs are random tensors made once in memory (nothing is loaded or augmented, which favours the
baseline). Prints one JSON object: {"mode", "ranks", "threads", "samples_per_s", "torch"}.
"""
import argparse
import json
import os
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(1024, 10))


def timed_steps(model, batch, steps, warmup):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    inputs = torch.randn(steps + warmup, batch, 1, 28, 28)
    labels = torch.randint(0, 10, (steps + warmup, batch))

    def step(i):
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs[i]), labels[i])
        loss.backward()
        optimizer.step()

    for i in range(warmup):
        step(i)
    begin = time.perf_counter()
    for i in range(warmup, warmup + steps):
        step(i)
    return time.perf_counter() - begin


def ddp_worker(rank, ranks, store, args, out):
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=ranks)
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    dist.barrier()
    seconds = timed_steps(model, args.batch // ranks, args.steps, args.warmup)
    dist.barrier()
    if rank == 0:
        out.put(args.steps * args.batch / seconds)
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=["ddp", "single"], default="ddp")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    args = parser.parse_args()
    if args.mode == "single":
        torch.set_num_threads(args.threads)
        seconds = timed_steps(make_model(), args.batch, args.steps, args.warmup)
        rate = args.steps * args.batch / seconds
        ranks, threads = 1, args.threads
    else:
        ctx = mp.get_context("spawn")
        out = ctx.SimpleQueue()
        with tempfile.TemporaryDirectory() as tmp:
            store = os.path.join(tmp, "store")
            mp.spawn(ddp_worker, args=(args.ranks, store, args, out), nprocs=args.ranks)
        rate = out.get()
        ranks, threads = args.ranks, 1
    print(json.dumps({"mode": args.mode, "ranks": ranks, "threads": threads,
                      "samples_per_s": rate, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
