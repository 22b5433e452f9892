#!/usr/bin/env python3
"""The PyTorch side of bench/distributed_vs_pytorch.sh: the GPT of bench/pytorch_gpt_model.py
trained data-parallel on WORLD local processes (torch.multiprocessing, gloo over TCP on
127.0.0.1, CPU, fp32, AdamW, gradient clipping 1.0), each rank with its own micro-batch, timed
per step after warm-up. The ZeRO stage is mapped to what PyTorch offers:

  0  DistributedDataParallel
  1  DistributedDataParallel + ZeroRedundancyOptimizer (AdamW state sharded)
  2  FullyShardedDataParallel, ShardingStrategy.SHARD_GRAD_OP, one unit per block
  3  FullyShardedDataParallel, ShardingStrategy.FULL_SHARD, one unit per block

  pytorch_distributed.py --world W --stage S --vocab V --context T --layers L --heads H
                         --width C --batch B --steps N [--warmup K]
  pytorch_distributed.py --count-params --vocab V --context T --layers L --heads H --width C

Prints one JSON line: {"stage", "world", "name", "params", "step_ms" (median), "tokens_per_second",
"peak_rss_bytes", "bytes_sent_per_step"} measured on rank 0 (per-rank values of every rank
under "ranks"), or {"stage", "world", "name", "unavailable": reason} where this PyTorch cannot
run the stage; tokens_per_second counts the tokens of all ranks. Bytes sent are the TCP payload
bytes this process's sockets put on the wire (TCP_INFO's tcpi_bytes_sent, summed over every
socket), so they are what gloo really sent, not what the collectives were asked to move."""
import argparse
import functools
import importlib
import json
import os
import re
import socket
import stat
import statistics
import struct
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pytorch_gpt_model import GPT, Block

NAMES = {0: "DDP", 1: "DDP + ZeroRedundancyOptimizer", 2: "FSDP SHARD_GRAD_OP", 3: "FSDP FULL_SHARD"}

# struct tcp_info (linux/tcp.h): tcpi_bytes_acked is at offset 120 (Linux 4.1), tcpi_bytes_sent
# (which also counts retransmissions; none on loopback) at 200 (Linux 4.19).
_BYTES_ACKED, _BYTES_SENT = 120, 200


def tcp_bytes_sent():
    """Payload bytes sent so far by every TCP socket this process has open."""
    total = 0
    for name in os.listdir("/proc/self/fd"):
        try:
            fd = int(name)
            if not stat.S_ISSOCK(os.fstat(fd).st_mode):
                continue
            sock = socket.socket(fileno=os.dup(fd))  # a duplicate: closing it leaves gloo's open
        except OSError:
            continue
        with sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6) or sock.type != socket.SOCK_STREAM:
                continue
            info = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 256)
            offset = _BYTES_SENT if len(info) >= _BYTES_SENT + 8 else _BYTES_ACKED
            total += struct.unpack_from("Q", info, offset)[0]
    return total


def peak_rss_bytes():
    """This process's resident high-water mark (VmHWM, as the engine reports it). Unlike
    getrusage's ru_maxrss it does not carry over the launching process's size through fork."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return 0


def fsdp_import_problem():
    """Why FullyShardedDataParallel cannot be imported here, or None. torch 1.13's cannot on
    Python 3.11 (a dataclass in torch.distributed._shard has a mutable default, which 3.11
    rejects), and its source also refuses CPU-only execution at the first forward pass; both
    are said, the second read from the installed source rather than assumed."""
    try:
        importlib.import_module("torch.distributed.fsdp")
    except Exception as error:
        python = ".".join(str(v) for v in sys.version_info[:3])
        message = re.sub(r"<class '[\w.]*?(\w+)'>", r"\1", str(error).splitlines()[0])
        reason = f"torch {torch.__version__} FSDP does not import on Python {python}: {type(error).__name__}: "
        reason += message
        source = os.path.join(os.path.dirname(torch.__file__), "distributed/fsdp/fully_sharded_data_parallel.py")
        refusal = "FSDP does not support CPU only execution"
        if os.path.exists(source) and refusal in open(source).read():
            reason += f"; where it imports, its first forward pass raises '{refusal}'"
        return reason
    return None


def wrap(model, stage):
    """The model and its optimizer for `stage`, per NAMES."""
    adamw = dict(lr=6e-4, weight_decay=0.1)
    if stage <= 1:
        model = torch.nn.parallel.DistributedDataParallel(model)
        if stage == 0:
            return model, torch.optim.AdamW(model.parameters(), **adamw)
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return model, ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.AdamW, **adamw)
    from torch.distributed.fsdp import FullyShardedDataParallel, ShardingStrategy
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    strategy = ShardingStrategy.SHARD_GRAD_OP if stage == 2 else ShardingStrategy.FULL_SHARD
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})
    model = FullyShardedDataParallel(model, sharding_strategy=strategy, auto_wrap_policy=policy)
    return model, torch.optim.AdamW(model.parameters(), **adamw)


def clip(model, stage):
    if stage >= 2:  # FSDP: the norm of the sharded gradients needs a reduction across ranks
        model.clip_grad_norm_(1.0)
    else:
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)


def rank_main(rank, args, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(max(1, 2 // args.world))
    torch.set_flush_denormal(True)  # as the engine does: denormals are 100x slower on x86
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = GPT(args.vocab, args.context, args.layers, args.heads, args.width)
    params = sum(p.numel() for p in model.parameters())
    generator = torch.Generator().manual_seed(1 + rank)  # each rank its own micro-batch
    tokens = torch.randint(0, args.vocab, (args.batch, args.context + 1), generator=generator)
    result = {"stage": args.stage, "world": args.world, "name": NAMES[args.stage]}
    try:
        model, optimizer = wrap(model, args.stage)
        times, sent = [], None
        for step in range(args.steps):
            if step == args.warmup:
                sent = tcp_bytes_sent()
            start = time.perf_counter()
            optimizer.zero_grad(set_to_none=True)
            model(tokens[:, :-1], tokens[:, 1:]).backward()
            clip(model, args.stage)
            optimizer.step()
            times.append(time.perf_counter() - start)
        timed = times[args.warmup :]
        step_s = statistics.median(timed)  # robust to the moments another process takes the cores
        result.update(
            params=params,
            step_ms=1e3 * step_s,
            tokens_per_second=args.world * args.batch * args.context / step_s,
            peak_rss_bytes=peak_rss_bytes(),
            bytes_sent_per_step=(tcp_bytes_sent() - sent) / len(timed),
        )
    except RuntimeError as error:  # e.g. torch 1.13's FSDP: "FSDP does not support CPU only execution"
        result["unavailable"] = f"torch {torch.__version__} {NAMES[args.stage]}: {str(error).splitlines()[0]}"
    results = [None] * args.world
    dist.all_gather_object(results, result)
    if rank == 0:
        row = dict(results[0])
        if "unavailable" not in row:
            keys = ("step_ms", "peak_rss_bytes", "bytes_sent_per_step")
            row["ranks"] = [{k: r.get(k) for k in keys} for r in results]
        print(json.dumps(row), flush=True)
    dist.barrier()
    # torch 1.13 can deadlock tearing down DDP's reducer (its gloo worker thread waits for the
    # interpreter lock the destructor holds), so leave without running any destructor.
    sys.stdout.flush()
    os._exit(0)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for name in ("vocab", "context", "layers", "heads", "width"):
        parser.add_argument(f"--{name}", type=int, required=True)
    parser.add_argument("--count-params", action="store_true", help="print the parameter count and exit")
    parser.add_argument("--world", type=int, default=1)
    parser.add_argument("--stage", type=int, choices=sorted(NAMES), default=0)
    parser.add_argument("--batch", type=int, default=1, help="micro-batch per rank")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2, help="first steps not timed (at most steps - 1)")
    args = parser.parse_args()
    if args.count_params:
        model = GPT(args.vocab, args.context, args.layers, args.heads, args.width)
        print(sum(p.numel() for p in model.parameters()))
        return
    if args.steps < 1 or args.world < 1:
        parser.error("--steps and --world must be at least 1")
    args.warmup = max(0, min(args.warmup, args.steps - 1))
    problem = fsdp_import_problem() if args.stage >= 2 else None
    if problem:
        row = {"stage": args.stage, "world": args.world, "name": NAMES[args.stage], "unavailable": problem}
        print(json.dumps(row))
        return
    os.environ["OMP_NUM_THREADS"] = str(max(1, 2 // args.world))
    mp.spawn(rank_main, args=(args, free_port()), nprocs=args.world)


if __name__ == "__main__":
    main()
