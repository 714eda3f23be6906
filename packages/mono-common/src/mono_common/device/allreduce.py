"""One-shot all-reduce as a device helper, fused with the residual add and RMSNorm.

Called by a stage of a persistent kernel, on every rank, by every program of the rank's grid.
The row width W is split into NBLK = W / BLOCK_N column blocks; program p of a rank owns
blocks p, p + nprog, ... in all three phases:

  1 push:   copy my partial of each owned block into slot [parity][my rank] of EVERY rank's
            mailbox (my own included), then bump flag[my rank][block] on every rank (release).
  2 reduce: wait until flag[q][block] >= epoch for every source q, sum the R partials in fp32 in
            the fixed order q = 0, 1, ..., R-1, add the residual, store the new residual, and
            write the block's per-row sum of squares to ssq[row, block]; bump the local ssq
            counter.
  3 norm:   wait until the ssq counter reaches epoch * NBLK, sum ssq over blocks (same order on
            every rank), and write out = residual_new * rsqrt(mean + eps) * weight.

Every rank runs the same arithmetic on the same bits in the same order, so every rank gets the
same bits. As in SGLang's fused_add_rmsnorm, the sum of squares uses the fp32 sum and the
output multiplies the rounded new residual.

The mailbox is double-buffered by epoch parity: rank r writes launch e + 2 into the half that
launch e used only after every rank pushed launch e + 1, which each did after finishing launch
e. Flags only grow (one per launch), so nothing is cleared between steps. A kernel with two
all-reduces per launch gives each call site its own mailbox, flags and ssq buffers.

Buffers (each rank's have the same layout; the tables hold the base address of every rank's):
  mbox_tab  *i64 [R]: mailbox, elements of the partial's dtype, [2][R][BLOCK_M][W]
  flag_tab  *i64 [R]: flags, int32 [R][NBLK], zero once at allocation
  ssq_ptr   *f32 [BLOCK_M][NBLK] local scratch; ssq_cnt_ptr *i32 local counter, zero once
`allreduce_sum` is phase 2 without the residual and the norm: the plain all-reduce of a
partial (e.g. an MoE output), fp32 sum in rank order, one rounding to the output dtype.
PHASES (constexpr bit mask 1|2|4) runs a subset, so the interpreter can run the phases as
separate launches (its programs run one after another, so a fused launch would wait forever).
"""

import triton
import triton.language as tl

from mono_common.device.guard import signal, wait_all_ge, wait_ge


@triton.jit
def _peer_addrs(tab, R: tl.constexpr, RP2: tl.constexpr):
    q = tl.arange(0, RP2)
    return tl.load(tab + tl.where(q < R, q, 0))


@triton.jit
def allreduce_push(part_ptr, stride_part, M, epoch, mbox_tab, flag_tab, rank, program, nprog,
                   W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                   R: tl.constexpr, RP2: tl.constexpr, SYS: tl.constexpr):
    NBLK: tl.constexpr = W // BLOCK_N
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    par = epoch & 1
    elt = part_ptr.dtype.element_ty
    flag_addrs = _peer_addrs(flag_tab, R, RP2)
    for blk in range(program, NBLK, nprog):
        c = blk * BLOCK_N + cols
        x = tl.load(part_ptr + rows[:, None] * stride_part + c[None, :], mask=rmask[:, None], other=0.0)
        slot = ((par * R + rank) * BLOCK_M + rows[:, None]) * W + c[None, :]
        for p in range(R):
            base = tl.load(mbox_tab + p).to(tl.pointer_type(elt))
            tl.store(base + slot, x, mask=rmask[:, None])
        # One vector release reaches flag[rank][blk] on every rank (pad lanes repeat rank 0's
        # flag, so they are masked off).
        fptrs = flag_addrs.to(tl.pointer_type(tl.int32)) + rank * NBLK + blk
        tl.debug_barrier()
        lane = tl.arange(0, RP2)
        one = tl.full([RP2], 1, tl.int32)
        if SYS:
            tl.atomic_add(fptrs, one, mask=lane < R, sem="release", scope="sys")
        else:
            tl.atomic_add(fptrs, one, mask=lane < R, sem="release", scope="gpu")


@triton.jit
def _sum_sources(my_mbox, par, rows, c, rmask, W: tl.constexpr, BLOCK_M: tl.constexpr, R: tl.constexpr):
    """fp32 sum of the R sources' partials of columns c in this mailbox half, rank order."""
    slot = ((par * R) * BLOCK_M + rows[:, None]) * W + c[None, :]
    # Start from source 0 itself (not 0.0 + p0) so a -0.0 survives, as in torch. A runtime
    # loop (not static_range) keeps the unrolled loads from spilling SGPRs on gfx950.
    acc = tl.load(my_mbox + slot, mask=rmask[:, None], other=0.0).to(tl.float32)
    for p in range(1, R):
        v = tl.load(my_mbox + slot + p * (BLOCK_M * W), mask=rmask[:, None], other=0.0)
        acc = acc + v.to(tl.float32)
    return acc


@triton.jit
def _reduce_blocks(out_ptr, stride_out, resid_ptr, stride_resid, ssq_ptr, M, epoch, mbox_tab, flag_tab,
                   abort_ptr, abort_tab, err_ptr, rank, program, nprog, stage, deadline,
                   W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                   R: tl.constexpr, RP2: tl.constexpr, NRANK: tl.constexpr, CLOCK: tl.constexpr,
                   FAULT: tl.constexpr, SYS: tl.constexpr, ELT: tl.constexpr, RESID: tl.constexpr):
    """Phase 2 over this program's blocks: wait for every source's flag, sum the partials
    (fp32, rank order), then either add the residual, store it and the block's sum of squares
    (RESID) or store the sum. Returns (ok, blocks done)."""
    NBLK: tl.constexpr = W // BLOCK_N
    rows = tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    rmask = rows < M
    par = epoch & 1
    my_mbox = tl.load(mbox_tab + rank).to(tl.pointer_type(ELT))
    my_flags = tl.load(flag_tab + rank).to(tl.pointer_type(tl.int32))
    src = tl.arange(0, RP2)
    src = tl.where(src < R, src, 0)
    ok = tl.full([], 1, tl.int1)
    done = 0
    for blk in range(program, NBLK, nprog):
        if ok:
            ok = wait_all_ge(my_flags + src * NBLK + blk, epoch, abort_ptr, abort_tab, err_ptr,
                             rank, program, stage, deadline, NRANK, CLOCK, FAULT, SYS)
        if ok:
            c = blk * BLOCK_N + cols
            acc = _sum_sources(my_mbox, par, rows, c, rmask, W, BLOCK_M, R)
            if RESID:
                r = tl.load(resid_ptr + rows[:, None] * stride_resid + c[None, :], mask=rmask[:, None], other=0.0)
                acc = acc + r.to(tl.float32)
                ssq = tl.sum(tl.where(rmask[:, None], acc * acc, 0.0), 1)
                tl.store(ssq_ptr + rows * NBLK + blk, ssq)
            tl.store(out_ptr + rows[:, None] * stride_out + c[None, :],
                     acc.to(out_ptr.dtype.element_ty), mask=rmask[:, None])
            done += 1
    return ok, done


@triton.jit
def allreduce_reduce(resid_ptr, stride_resid, resid_out_ptr, stride_out, M, epoch,
                     mbox_tab, flag_tab, ssq_ptr, ssq_cnt_ptr,
                     abort_ptr, abort_tab, err_ptr, rank, program, nprog, stage, deadline,
                     W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                     R: tl.constexpr, RP2: tl.constexpr, NRANK: tl.constexpr, CLOCK: tl.constexpr,
                     FAULT: tl.constexpr, SYS: tl.constexpr, ELT: tl.constexpr):
    ok, done = _reduce_blocks(resid_out_ptr, stride_out, resid_ptr, stride_resid, ssq_ptr, M, epoch,
                              mbox_tab, flag_tab, abort_ptr, abort_tab, err_ptr, rank, program, nprog,
                              stage, deadline, W, BLOCK_N, BLOCK_M, R, RP2, NRANK, CLOCK, FAULT, SYS,
                              ELT, True)
    if ok:
        signal(ssq_cnt_ptr, done, False)
    return ok


@triton.jit
def allreduce_sum(out_ptr, stride_out, M, epoch, mbox_tab, flag_tab,
                  abort_ptr, abort_tab, err_ptr, rank, program, nprog, stage, deadline,
                  W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                  R: tl.constexpr, RP2: tl.constexpr, NRANK: tl.constexpr, CLOCK: tl.constexpr,
                  FAULT: tl.constexpr, SYS: tl.constexpr, ELT: tl.constexpr):
    """Wait for every rank's push of this program's blocks, store their fp32 sum (rank order
    0..R-1, one rounding to out's dtype). Returns ok (False: the error word is written)."""
    ok, _ = _reduce_blocks(out_ptr, stride_out, out_ptr, stride_out, out_ptr, M, epoch, mbox_tab,
                           flag_tab, abort_ptr, abort_tab, err_ptr, rank, program, nprog, stage,
                           deadline, W, BLOCK_N, BLOCK_M, R, RP2, NRANK, CLOCK, FAULT, SYS, ELT, False)
    return ok


@triton.jit
def allreduce_norm(resid_out_ptr, stride_out, out_ptr, stride_o, w_ptr, M, eps, epoch,
                   ssq_ptr, ssq_cnt_ptr,
                   abort_ptr, abort_tab, err_ptr, rank, program, nprog, stage, deadline,
                   W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                   NRANK: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr):
    NBLK: tl.constexpr = W // BLOCK_N
    NBLK_P2: tl.constexpr = triton.next_power_of_2(NBLK)
    ok = wait_ge(ssq_cnt_ptr, epoch * NBLK, abort_ptr, abort_tab, err_ptr, rank, program, stage + 1,
                 deadline, NRANK, CLOCK, FAULT, False)
    if ok:
        rows = tl.arange(0, BLOCK_M)
        cols = tl.arange(0, BLOCK_N)
        rmask = rows < M
        b = tl.arange(0, NBLK_P2)
        s = tl.load(ssq_ptr + rows[:, None] * NBLK + b[None, :], mask=b[None, :] < NBLK, other=0.0)
        total = tl.sum(s, 1)
        rstd = 1.0 / tl.sqrt_rn(total / W + eps)
        for blk in range(program, NBLK, nprog):
            c = blk * BLOCK_N + cols
            h = tl.load(resid_out_ptr + rows[:, None] * stride_out + c[None, :], mask=rmask[:, None], other=0.0)
            w = tl.load(w_ptr + c).to(tl.float32)
            y = h.to(tl.float32) * rstd[:, None] * w[None, :]
            tl.store(out_ptr + rows[:, None] * stride_o + c[None, :], y.to(out_ptr.dtype.element_ty),
                     mask=rmask[:, None])
    return ok


@triton.jit
def allreduce_rmsnorm(part_ptr, stride_part, resid_ptr, stride_resid, resid_out_ptr, stride_ro,
                      out_ptr, stride_o, w_ptr, M, eps, epoch,
                      mbox_tab, flag_tab, ssq_ptr, ssq_cnt_ptr,
                      abort_ptr, abort_tab, err_ptr, rank, program, nprog, stage, deadline,
                      W: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                      R: tl.constexpr, RP2: tl.constexpr, NRANK: tl.constexpr, CLOCK: tl.constexpr,
                      FAULT: tl.constexpr, SYS: tl.constexpr, PHASES: tl.constexpr):
    """All three phases (or the PHASES subset) for this program; returns ok (False: stop).

    Error-word stages used: `stage` for the flag waits, `stage + 1` for the ssq wait."""
    ok = tl.full([], 1, tl.int1)
    if PHASES & 1:
        allreduce_push(part_ptr, stride_part, M, epoch, mbox_tab, flag_tab, rank, program, nprog,
                       W, BLOCK_N, BLOCK_M, R, RP2, SYS)
    if PHASES & 2:
        ok = allreduce_reduce(resid_ptr, stride_resid, resid_out_ptr, stride_ro, M, epoch,
                              mbox_tab, flag_tab, ssq_ptr, ssq_cnt_ptr,
                              abort_ptr, abort_tab, err_ptr, rank, program, nprog, stage, deadline,
                              W, BLOCK_N, BLOCK_M, R, RP2, NRANK, CLOCK, FAULT, SYS,
                              part_ptr.dtype.element_ty)
    if PHASES & 4:
        if ok:
            ok = allreduce_norm(resid_out_ptr, stride_ro, out_ptr, stride_o, w_ptr, M, eps, epoch,
                                ssq_ptr, ssq_cnt_ptr,
                                abort_ptr, abort_tab, err_ptr, rank, program, nprog, stage, deadline,
                                W, BLOCK_N, BLOCK_M, NRANK, CLOCK, FAULT)
    return ok
