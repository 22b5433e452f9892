"""PyTorch's AdamW on the CPU over one flat parameter of N elements: the best of R timed steps for
each implementation this torch offers (foreach=True; fused=True where torch supports it on the CPU).

    OMP_NUM_THREADS=2 python3 bench/pytorch_adamw.py N R

Prints its thread count, then one tab-separated line per implementation: name, parameters per second (or "-" and why not).
"""
import sys
import time

import torch


def best_step_seconds(n, repeats, **options):
    p = torch.nn.Parameter(torch.ones(n))
    p.grad = torch.full((n,), 1e-3)
    opt = torch.optim.AdamW([p], lr=3e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, **options)
    opt.step()  # allocates the state
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        opt.step()
        best = min(best, time.perf_counter() - start)
    return best


def main():
    n, repeats = int(sys.argv[1]), int(sys.argv[2])
    print(f"threads\t{torch.get_num_threads()}", flush=True)
    for name, options in (("foreach", {"foreach": True}), ("fused", {"fused": True})):
        try:
            seconds = best_step_seconds(n, repeats, **options)
        except (TypeError, RuntimeError, ValueError) as e:
            print(f"{name}\t-\tnot available in torch {torch.__version__} ({type(e).__name__})", flush=True)
            continue
        print(f"{name}\t{n / seconds:.4g}", flush=True)


if __name__ == "__main__":
    main()
