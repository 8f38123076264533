# SPDX-License-Identifier: Apache-2.0
"""PyTorch baseline of bench_trainer: the same MLP (784-1024-1024-10, ReLU, dropout 0.1), SGD
with Nesterov momentum, softmax cross-entropy, at the same batch and thread count, on CPU.

  python3 torch_mlp.py --threads 1 --batch 256 --steps 60 --warmup 5 [--bf16]

--bf16 runs forward and the loss under torch.autocast("cpu", dtype=torch.bfloat16), PyTorch's
mixed precision on CPU (float32 weights, bfloat16 matmuls where the CPU has them).

torch.set_num_threads sizes PyTorch's OpenMP team only: the OpenBLAS behind its float32
products takes its thread count from OPENBLAS_NUM_THREADS (bench_trainer sets it to --threads),
else uses every CPU. bench_trainer runs this script twice per row, with and without
OMP_WAIT_POLICY=PASSIVE (OpenMP's threads sleeping between parallel regions rather than spinning
on the CPUs OpenBLAS's threads need), and keeps the faster.

Inputs are random tensors made once in memory (no loading or augmentation is timed, which
favours this baseline). Prints one JSON object: {"threads", "batch", "samples_per_s", "torch"}.
"""
import argparse
import json
import time

import torch


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bf16", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Flatten(),
        torch.nn.Linear(784, 1024), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(1024, 1024), torch.nn.ReLU(), torch.nn.Dropout(0.1),
        torch.nn.Linear(1024, 10))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True,
                                weight_decay=5e-4)
    loss_fn = torch.nn.CrossEntropyLoss()
    inputs = torch.randn(args.steps + args.warmup, args.batch, 1, 28, 28)
    labels = torch.randint(0, 10, (args.steps + args.warmup, args.batch))

    def step(i):
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.bf16):
            loss = loss_fn(model(inputs[i]), labels[i])
        loss.backward()
        optimizer.step()

    rates = []
    for _ in range(args.repeats):
        for i in range(args.warmup):
            step(i)
        begin = time.perf_counter()
        for i in range(args.warmup, args.warmup + args.steps):
            step(i)
        rates.append(args.steps * args.batch / (time.perf_counter() - begin))
    rates.sort()
    print(json.dumps({"threads": args.threads, "batch": args.batch,
                      "samples_per_s": rates[len(rates) // 2], "torch": torch.__version__,
                      "bf16": args.bf16}))


if __name__ == "__main__":
    main()
