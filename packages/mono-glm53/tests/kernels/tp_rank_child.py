"""One TP rank process of test_tp_processes_gpu.py (run by mono_common.testing.ranks).

usage: python tp_rank_child.py RANK WORLD OUT CASE WIDTHS CTX
  CASE "layer": every width in WIDTHS (comma list) runs one covered layer three times
  through the serving launcher; "fault": width WIDTHS[0], rank 1 stops at the MLA hand-off.

What a server's rank does, without sglang: the layer's peer regions and the shared abort flag
come from `mono_glm53.build.layer_peers` over a gloo group (SGLang's TP CPU group in a
server: CUDA IPC handles), and the launches go through `build.KernelLayer.run` with
`forward.StepInputs` / `LayerCaches`, as `GlmMonoForward` calls it. The weights are the real
GLM-5.3 layer's random ones (seed 0, made on every rank alike), cut to this rank's shard;
rank 0 also runs `reference.decoder_layer_tp` over every rank's shard. Each rank gets
`default_nprog // WORLD` programs and launches plainly (the ranks share the GPU).

A first launch with a long deadline compiles the kernel on every rank before the ranks meet
at a barrier; the checked launches come after it (a rank still compiling would otherwise
leave its peers waiting past a short deadline).
"""

import faulthandler
import hashlib
import sys
import time
import types

import torch

from mono_common import errors
from mono_common.guard_host import deadline_ticks
from mono_common.testing import ranks

LAYER = 3
SEED = 7
WARM_S, RUN_S = 300.0, 20.0  # deadlines: the compiling launch, the checked ones
SHORT_S, LONG_S = 0.5, 10.0  # the fault case: rank 1's deadline, every other rank's


def _digest(t: torch.Tensor) -> str:
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.view(torch.uint8).numpy().tobytes()).hexdigest()


def main():
    rank, world, out, (case, widths_arg, ctx_arg) = ranks.child_args()
    widths, ctx = tuple(int(w) for w in widths_arg.split(",")), int(ctx_arg)
    torch.cuda.set_device(0)
    dev = torch.device("cuda", 0)
    group = ranks.init_group(rank, world)
    import torch.distributed as dist

    from mono_glm53 import reference as ref
    from mono_glm53.build import KernelLayer, layer_peers
    from mono_glm53.config import REAL
    from mono_glm53.forward import LayerCaches, StepInputs
    from mono_glm53.kernels.harness import build_case, compare
    from mono_glm53.kernels.layer import default_nprog, fault_stage
    from mono_glm53.kernels.numerics import failures
    from mono_glm53.weights import make_weights, shard_weights

    # The ranks make the whole layer's weights one after another: eight full copies at once
    # (~14 GB each while sharding) ran the one H200 out of memory at TP 8.
    mine = [rank] if rank else list(range(world))  # rank 0 keeps every shard for the reference
    for turn in range(world):
        if turn == rank:
            full = make_weights(REAL, device=dev, seed=0)
            shards = {q: shard_weights(full, REAL, world, q) for q in mine}
            del full
            torch.cuda.empty_cache()
        dist.barrier(group)
    shape, w = shards[rank]

    # the serving path: peers over the group, the launcher as build makes it
    peers = layer_peers(shape, widths, group=group, device=dev, deadline_s=WARM_S, mode="report")
    context = types.SimpleNamespace(widths=widths, deadline_s=WARM_S)
    launcher = KernelLayer(shape, {LAYER: w}, context, "fused", peers, nprog=default_nprog(dev) // world,
                           cooperative=False)
    guard = peers.guard
    result = {"rank": rank, "widths": {}}

    def step_of(c):
        i = c.inputs
        return StepInputs(positions=i.positions, out_cache_loc=i.out_cache_loc, seq_lens=i.seq_lens,
                          req_pool_indices=i.req_pool_indices, req_to_token=i.req_to_token,
                          max_seq_len=i.max_seq_len)

    def run(c, step, caches):
        hidden, residual, topk = launcher.run(LAYER, c.hidden, c.residual, step, caches, None)
        return hidden, residual, topk

    for width in widths:
        c = build_case(shape, width, ctx, True, dev, SEED + width, weights=w)
        step = step_of(c)
        # every rank made the same step (the same seeds): proven, not assumed
        mine_in = _digest(torch.cat([c.hidden.view(torch.int16).flatten(), c.residual.view(torch.int16).flatten()]))
        ins = [None] * world
        dist.all_gather_object(ins, mine_in, group=group)
        if len(set(ins)) != 1:
            raise SystemExit(f"the ranks built different steps: {ins}")
        caches = LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
        guard.deadline = deadline_ticks(WARM_S, guard.clock)
        run(c, step, caches)  # compiles
        torch.cuda.synchronize()
        guard.check(synchronize=False)
        print(f"rank {rank}: width {width} compiled and ran", flush=True)
        dist.barrier(group)
        k = launcher.kernel(LAYER, width, step.max_seq_len)

        if case == "fault":
            caches = LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
            k.stall = fault_stage(rank, "rank1:stage12")  # what MONO_GLM53_FAULT sets at build
            # the kernel's own deadline (a launch argument): the guard's is read once, when
            # the launcher builds the kernel, so setting it now would change nothing
            k.deadline = deadline_ticks(SHORT_S if rank == 1 else LONG_S, guard.clock)
            dist.barrier(group)
            t0 = time.monotonic()
            # a rank still inside long after every deadline prints where it is (the parent
            # shows each rank's log tail when it kills the ranks)
            faulthandler.dump_traceback_later(LONG_S + 20.0, exit=False)
            print(f"rank {rank}: fault launch", flush=True)
            try:  # in report mode the launch itself may check its guard and raise
                run(c, step, caches)
                torch.cuda.synchronize()
                guard.check(synchronize=False)
                result["stopped"] = False
            except errors.MonoDeviceError as e:
                wd = e.word
                result.update(stopped=True, message=str(e), code=wd.code, stage=wd.stage, word_rank=wd.rank,
                              origin=wd.origin, flag=int(guard.abort[0, 0].item()), stamp=int(wd.stamp))
            result["wall_s"] = time.monotonic() - t0
            faulthandler.cancel_dump_traceback_later()
            print(f"rank {rank}: fault launch returned after {result['wall_s']:.3f} s", flush=True)
            break

        k.deadline = deadline_ticks(RUN_S, guard.clock)
        outs, digests = [], []
        for _ in range(3):  # epochs 2..4: both mailbox halves, then the first again
            caches = LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
            dist.barrier(group)
            o = [t.clone() for t in run(c, step, caches)]
            torch.cuda.synchronize()
            guard.check(synchronize=False)
            outs.append((o, caches))
            loc = c.inputs.out_cache_loc
            kv_rows = caches.kv.view(-1, shape.kv_cache_dim)[loc]
            digests.append([_digest(o[0]), _digest(o[1]), _digest(o[2][:width]), _digest(kv_rows)])
        rw = {"digests": digests}
        # every rank's output, residual and top-k against rank 0's (the bits must agree)
        mine_out = (outs[0][0][0].cpu(), outs[0][0][1].cpu())
        all_out = [None] * world
        dist.all_gather_object(all_out, mine_out, group=group)
        rw["ranks_equal_max_abs"] = max(
            float((a.float() - b.float()).abs().max()) for o in all_out for a, b in zip(o, all_out[0]))
        if rank == 0:
            ws = [shards[q][1] for q in range(world)]
            shapes = [shards[q][0] for q in range(world)]
            r_caches = [ref.LayerCaches(kv=c.caches.kv.clone(), index_k=c.caches.index_k.clone())
                        for _ in range(world)]
            r_out = ref.decoder_layer_tp(c.hidden, c.residual, c.inputs, r_caches, ws, shapes)
            o, caches = outs[0]
            metrics = compare(c, r_out, r_caches[0], tuple(o), ref.LayerCaches(kv=caches.kv, index_k=caches.index_k),
                              k)
            rw["metrics"] = metrics
            rw["failures"] = {n: list(v) for n, v in failures(metrics).items()}
        result["widths"][str(width)] = rw
    dist.barrier(group)  # no rank frees its pools while a peer's launch may still read them
    ranks.write_result(out, result)
    dist.destroy_process_group()


if __name__ == "__main__":
    sys.exit(main())
