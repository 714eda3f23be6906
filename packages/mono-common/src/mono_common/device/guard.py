"""Guarded waits: poll device counters until a target, a deadline, or the abort flag.

Every wait of a mono kernel goes through `wait_ge` (one counter) or `wait_all_ge` (a vector of
counters, e.g. one flag per peer rank); `wait_ge_spin` is `wait_ge` with its poll in one
thread's loop of sm_90 assembly (a measurement form: mono-glm53's knob `handoff_spin`). Each
returns `ok`; a caller that gets False must stop (`if not ok: return`): the error word is
already written and the abort flag raised.

Portability: on gfx950 a scalar atomic or a volatile load polled in a loop has hung in Triton
(anchors.md section 5: triton#11037, #11223, FlagTree#1051). Every poll here is a vector-shaped
atomic over DISTINCT addresses (counter and abort flag in one 2-lane atomic, or one lane per
counter), reduced with tl.sum/tl.min, so the backend never takes the single-lane path.

Arguments shared by the helpers (the "guard" arguments, passed through unchanged by callers):
  abort_ptr   *i32: this rank's abort flag (2 words: flag, spare), 0 until some program aborts
  abort_tab   *i64: the address of every rank's abort flag, indexed by rank
  err_ptr     *i64: this rank's error word (mono_common.errors layout), host-visible
  rank, program: who is waiting (program = index inside this rank's part of the grid)
  stage       an int naming the wait site in the error word
  deadline    int64 ticks of clock CLOCK (mono_common.guard_host.deadline_ticks)
  NRANK       constexpr, ranks sharing the abort protocol (1 for a single GPU)
  CLOCK       constexpr clock id (mono_common.device.timer)
  FAULT       constexpr: after the error word, store to address 0x0 so the process dies
  SYS         constexpr: system scope (flags written by other GPUs) instead of gpu scope

One decision per program: a wait's loop and its failure path hold barriers (the poll result is
broadcast through shared memory, the error word's claim too), so every warp of a program must
leave the loop on the same iteration with the same verdict. Everything the loop condition
reads is therefore one value for the whole program: the poll (one atomic per distinct address,
its result broadcast), the abort flag (the same atomic) and the clock (`timer.program_now`:
every thread's reading reduced to one, not each thread's own). Reading the clock per thread
let warps disagree at the deadline: one warp failed while another kept polling, and their
barriers paired across different code.

Counters are int32 and compared modulo 2**32 (`cnt - target >= 0` in int32; a target of any
integer width is first truncated to the counter's 32 bits): right for as long as a counter is
within 2**31 of the target it is compared with, which `mono_common.device.epochs` shows holds
for epoch counters at any launch count. Pointers must be 4-byte aligned int32 words.
"""

import triton
import triton.language as tl

from mono_common.device.timer import PROGRAM_LANES, now, program_elapsed, program_now

# Error-word slots and codes: the numbers of mono_common.errors (a unit test keeps them equal).
_STATE = tl.constexpr(0)
_CODE = tl.constexpr(1)
_STAGE = tl.constexpr(2)
_RANK = tl.constexpr(3)
_PROGRAM = tl.constexpr(4)
_OBSERVED = tl.constexpr(5)
_EXPECTED = tl.constexpr(6)
_LANE = tl.constexpr(7)
_WAITED = tl.constexpr(8)
_ORIGIN = tl.constexpr(9)
_STAMP = tl.constexpr(10)
_NSLOTS = tl.constexpr(16)


@triton.jit
def poll(ptrs, SYS: tl.constexpr):
    """Acquire-read a tensor of int32 counters with one vector atomic add of zero."""
    zero = tl.zeros(ptrs.shape, tl.int32)
    if SYS:
        v = tl.atomic_add(ptrs, zero, sem="acquire", scope="sys")
    else:
        v = tl.atomic_add(ptrs, zero, sem="acquire", scope="gpu")
    return v


@triton.jit
def signal(cnt_ptr, amount, SYS: tl.constexpr):
    """Release: make this program's earlier stores visible, then add `amount` to a counter."""
    # Every thread of the program wrote data; the barrier orders those writes before the one
    # thread that performs the release atomic.
    tl.debug_barrier()
    if SYS:
        tl.atomic_add(cnt_ptr, amount, sem="release", scope="sys")
    else:
        tl.atomic_add(cnt_ptr, amount, sem="release", scope="gpu")


@triton.jit
def signal_all(cnt_ptrs, amount, SYS: tl.constexpr):
    """Release to a tensor of counters (e.g. one per peer rank) with one vector atomic."""
    tl.debug_barrier()
    amounts = tl.full(cnt_ptrs.shape, 0, tl.int32) + amount
    if SYS:
        tl.atomic_add(cnt_ptrs, amounts, sem="release", scope="sys")
    else:
        tl.atomic_add(cnt_ptrs, amounts, sem="release", scope="gpu")


@triton.jit
def _rank_abort_ptrs(abort_tab, NRANK: tl.constexpr):
    # At least 2 lanes so the CAS is vector-shaped; lanes past NRANK repeat rank 0 (harmless).
    NP2: tl.constexpr = 2 if NRANK <= 2 else (4 if NRANK <= 4 else (8 if NRANK <= 8 else 16))
    lanes = tl.arange(0, NP2)
    lanes = tl.where(lanes < NRANK, lanes, 0)
    return tl.load(abort_tab + lanes).to(tl.pointer_type(tl.int32))


@triton.jit
def raise_abort(abort_tab, rank, NRANK: tl.constexpr):
    """Set every rank's abort flag to rank + 1 unless some rank set it first."""
    ptrs = _rank_abort_ptrs(abort_tab, NRANK)
    cmp = tl.zeros(ptrs.shape, tl.int32)
    val = cmp + (rank + 1)
    tl.atomic_cas(ptrs, cmp, val, sem="release", scope="sys")


@triton.jit
def fault():
    """Store to address 0x0: the launch dies with an illegal-address error, and so does the
    process, which is how SGLang learns to stop every rank."""
    zero = tl.full([], 0, tl.int64)
    tl.store(zero.to(tl.pointer_type(tl.int32)), 1)


@triton.jit
def _i64(x):
    # Works for Python ints and tensors of any int width alike.
    return tl.full([], 0, tl.int64) + x


@triton.jit
def write_error(err_ptr, code, stage, rank, program, observed, expected, lane, waited, origin, stamp):
    """Fill this rank's error word if no program of the rank did so first. `stamp`: the clock
    when the program gave up (ticks of the wait's clock; the poll count for CLOCK_ITER), so
    words of different ranks tell how long after one rank's timeout another stopped."""
    zero = tl.full([], 0, tl.int64)
    old = tl.atomic_cas(err_ptr + _STATE, zero, zero + 1, sem="acquire", scope="sys")
    if old == 0:
        slots = tl.arange(0, _NSLOTS)
        vals = tl.zeros([_NSLOTS], tl.int64)
        vals = tl.where(slots == _CODE, _i64(code), vals)
        vals = tl.where(slots == _STAGE, _i64(stage), vals)
        vals = tl.where(slots == _RANK, _i64(rank), vals)
        vals = tl.where(slots == _PROGRAM, _i64(program), vals)
        vals = tl.where(slots == _OBSERVED, _i64(observed), vals)
        vals = tl.where(slots == _EXPECTED, _i64(expected), vals)
        vals = tl.where(slots == _LANE, _i64(lane), vals)
        vals = tl.where(slots == _WAITED, _i64(waited), vals)
        vals = tl.where(slots == _ORIGIN, _i64(origin), vals)
        vals = tl.where(slots == _STAMP, _i64(stamp), vals)
        tl.store(err_ptr + slots, vals, mask=(slots > _STATE) & (slots <= _STAMP))
        tl.debug_barrier()
        tl.atomic_xchg(err_ptr + _STATE, zero + 2, sem="release", scope="sys")


# Cold path, inlined: on gfx950 a real call makes every scalar value live across a call site
# spill into VGPR lanes (the call ABI clobbers SGPRs), which cost more than the inlined body
# in a kernel with one wait per stage (mono-glm53's layer kernel: 2 SGPR spills with the call,
# none inlined, Triton 3.8).
@triton.jit
def fail(abort_val, observed, expected, lane, waited, stamp, abort_tab, err_ptr, rank, program, stage,
         NRANK: tl.constexpr, FAULT: tl.constexpr):
    """Record why this program stops; raise the abort flag when the cause is our own timeout.
    Called by every warp of the program or by none (its branches read only program values)."""
    if abort_val != 0:
        write_error(err_ptr, 2, stage, rank, program, observed, expected, lane, waited, abort_val - 1, stamp)
    else:
        write_error(err_ptr, 1, stage, rank, program, observed, expected, lane, waited, rank, stamp)
        raise_abort(abort_tab, rank, NRANK)
    if FAULT:
        fault()


# sm_90 (CLOCK 0): the cold path as a real call. Inlined, it is ~2.5 KB of SASS after every
# wait, laid out between the hot blocks: the GLM-5.3 layer's hand-offs took ~1.05 us each with
# it inlined, ~0.72 us as a call (H200, session 21). The call costs registers (that layer: 8-12
# spilled bytes under Triton 3.6, none under 3.8 with its HWQ); gfx950 keeps it inlined (see
# `fail`).
@triton.jit(noinline=True)
def _fail_call(abort_val, observed, expected, lane, waited, stamp, abort_tab, err_ptr, rank, program, stage,
               NRANK: tl.constexpr, FAULT: tl.constexpr):
    fail(abort_val, observed, expected, lane, waited, stamp, abort_tab, err_ptr, rank, program, stage, NRANK, FAULT)


@triton.jit
def _fail(abort_val, observed, expected, lane, waited, stamp, abort_tab, err_ptr, rank, program, stage,
          NRANK: tl.constexpr, FAULT: tl.constexpr, CLOCK: tl.constexpr):
    if CLOCK == 0:
        _fail_call(abort_val, observed, expected, lane, waited, stamp, abort_tab, err_ptr, rank, program, stage,
                   NRANK, FAULT)
    else:
        fail(abort_val, observed, expected, lane, waited, stamp, abort_tab, err_ptr, rank, program, stage, NRANK,
             FAULT)


@triton.jit
def wrap32(x):
    """x (an int of any width, or a Python int) as the int32 it is modulo 2**32."""
    return (tl.full([], 0, tl.int64) + x).to(tl.int32)


# Polls between two clock readings of a waiting program: a reading is a program-wide maximum
# through shared memory (a barrier), which made each poll slower and so the moment a program
# sees its counter later; the deadline is then noticed at most CLOCK_EVERY - 1 polls late.
CLOCK_EVERY = tl.constexpr(8)


@triton.jit
def _waited(waited, start, iters, CLOCK: tl.constexpr):
    """The wait's elapsed ticks, refreshed every CLOCK_EVERY polls (every poll for CLOCK_ITER,
    whose ticks are the polls): `iters` is a program value, so every warp refreshes alike."""
    if CLOCK == 2:
        w = program_elapsed(start, iters, CLOCK)
    else:
        w = waited
        if iters % CLOCK_EVERY == 0:
            w = program_elapsed(start, iters, CLOCK)
    return w


@triton.jit
def _stop_stamp(start, waited, CLOCK: tl.constexpr):
    """The clock when a wait gives up, for its error word: read afresh (a program that leaves
    on the abort flag holds a `waited` up to CLOCK_EVERY - 1 polls old, which put a rank's
    stop before the timeout that caused it; H200, TP-process fault test, session 15). The
    thread's own reading: the stamp is only stored, no branch reads it, so it needs no
    program-wide maximum (whose shared-memory exchange cost 32 spill bytes in the all-reduce
    kernel on sm_90). For CLOCK_ITER the poll count, as `waited` is."""
    if CLOCK == 2:
        t = start + waited
    else:
        t = now(CLOCK)
    return t


@triton.jit
def wait_ge(cnt_ptr, target, abort_ptr, abort_tab, err_ptr, rank, program, stage, deadline,
            NRANK: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, SYS: tl.constexpr):
    """Wait until the int32 counter at `cnt_ptr` reaches `target` (modulo 2**32: cnt - target
    >= 0 in int32).

    Returns True when reached; False after a timeout or the abort flag (error word written,
    abort raised, and with FAULT the process is already dying). Every warp of the program
    returns the same value after the same number of polls."""
    lane = tl.arange(0, 2)
    tgt = wrap32(target)
    # One 2-lane atomic reads the counter and the abort flag together; its result reaches every
    # warp through shared memory, so cur and ab are program values.
    ptrs = tl.where(lane == 0, cnt_ptr, abort_ptr)
    start = program_now(CLOCK)
    v = poll(ptrs, SYS)
    cur = tl.sum(tl.where(lane == 0, v, 0), 0)
    ab = tl.sum(tl.where(lane == 1, v, 0), 0)
    iters = 0
    waited = tl.full([], 0, tl.int64)
    while ((cur - tgt) < 0) & (ab == 0) & (waited < deadline):
        v = poll(ptrs, SYS)
        cur = tl.sum(tl.where(lane == 0, v, 0), 0)
        ab = tl.sum(tl.where(lane == 1, v, 0), 0)
        iters += 1
        waited = _waited(waited, start, iters, CLOCK)
    ok = ((cur - tgt) >= 0) & (ab == 0)
    if not ok:
        _fail(ab, cur, tgt, 0, waited, _stop_stamp(start, waited, CLOCK), abort_tab, err_ptr, rank, program, stage, NRANK,
              FAULT, CLOCK)
    # Threads other than the polling ones read data the producers wrote: order after the poll.
    tl.debug_barrier()
    return ok


# `wait_ge_spin`'s loop (sm_90): thread 0 polls the counter with acquire RMWs of zero and the
# abort flag with relaxed loads, reads %globaltimer every 64 polls against the deadline, and
# leaves with 0 (reached), 1 (the abort flag) or 2 (the deadline); every other thread leaves at
# once with 0. $1 counter address, $2 target, $3 abort flag address, $4 deadline (ns). The
# labels are local to the braces (the block is inlined at every hand-off of a kernel).
_SPIN_WAIT = """{
.reg .pred p;
.reg .b32 t, v, a, i;
.reg .b64 t0, t1, d;
mov.u32 $0, 0;
mov.u32 t, %tid.x;
setp.ne.u32 p, t, 0;
@p bra DONE;
mov.u64 t0, %globaltimer;
mov.u32 i, 0;
LOOP:
atom.acquire.SCOPE.global.add.u32 v, [$1], 0;
sub.s32 v, v, $2;
setp.ge.s32 p, v, 0;
@p bra DONE;
ld.relaxed.SCOPE.global.b32 a, [$3];
setp.ne.s32 p, a, 0;
@p bra ABORT;
add.u32 i, i, 1;
and.b32 v, i, 63;
setp.ne.u32 p, v, 0;
@p bra LOOP;
mov.u64 t1, %globaltimer;
sub.s64 d, t1, t0;
setp.lt.s64 p, d, $4;
@p bra LOOP;
mov.u32 $0, 2;
bra DONE;
ABORT:
mov.u32 $0, 1;
DONE:
}"""
_SPIN_WAIT_GPU = tl.constexpr(_SPIN_WAIT.replace("SCOPE", "gpu"))
_SPIN_WAIT_SYS = tl.constexpr(_SPIN_WAIT.replace("SCOPE", "sys"))


@triton.jit
def wait_ge_spin(cnt_ptr, target, abort_ptr, abort_tab, err_ptr, rank, program, stage, deadline,
                 NRANK: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, SYS: tl.constexpr):
    """`wait_ge` with its poll in one thread's loop (sm_90, CLOCK 0 only): thread 0 polls the
    counter, the abort flag and every 64 polls the clock in inline assembly with no barrier a
    poll (`wait_ge`'s poll broadcasts a 2-lane atomic through shared memory and every 8 polls
    the clock: ~92 instructions and 5 barriers a poll in mono-glm53's layer, sm_90 SASS); the
    verdict then reaches every warp through one shared-memory maximum, so every warp returns
    the same value, and its barrier orders the other threads' reads after thread 0's acquire.
    The same arguments, results and error words as `wait_ge` (the failure path re-reads the
    counter and the abort flag for the word)."""
    tl.static_assert(CLOCK == 0, "wait_ge_spin is sm_90 inline assembly (CLOCK 0, %globaltimer)")
    tgt = wrap32(target)
    start = program_now(CLOCK)
    cnt_addr = cnt_ptr.to(tl.pointer_type(tl.int32)).to(tl.int64, bitcast=True)
    ab_addr = abort_ptr.to(tl.pointer_type(tl.int32)).to(tl.int64, bitcast=True)
    dl = tl.full([], 0, tl.int64) + deadline
    if SYS:
        st = tl.inline_asm_elementwise(_SPIN_WAIT_SYS, "=r,l,r,l,l", [cnt_addr, tgt, ab_addr, dl], dtype=tl.int32,
                                       is_pure=False, pack=1)
    else:
        st = tl.inline_asm_elementwise(_SPIN_WAIT_GPU, "=r,l,r,l,l", [cnt_addr, tgt, ab_addr, dl], dtype=tl.int32,
                                       is_pure=False, pack=1)
    # thread 0's verdict to every warp (the other threads hold 0)
    st = tl.max(tl.full([PROGRAM_LANES], 0, tl.int32) + st, 0)
    ok = st == 0
    if not ok:
        lane = tl.arange(0, 2)
        v = poll(tl.where(lane == 0, cnt_ptr, abort_ptr), SYS)
        cur = tl.sum(tl.where(lane == 0, v, 0), 0)
        ab = tl.sum(tl.where(lane == 1, v, 0), 0)
        waited = program_elapsed(start, 0, CLOCK)
        _fail(ab, cur, tgt, 0, waited, _stop_stamp(start, waited, CLOCK), abort_tab, err_ptr, rank, program, stage,
              NRANK, FAULT, CLOCK)
    tl.debug_barrier()
    return ok


@triton.jit
def arrive_last(cnt_ptr, target, SYS: tl.constexpr):
    """Add 1 to the int32 counter at cnt_ptr after every thread's writes (one acq_rel RMW a
    program); returns whether this arrival made it `target` (modulo 2**32), a program value.
    acq_rel, not release: the last arrival then acquires every earlier arrival's release-add
    (one release sequence on the counter), so what it does next sees their writes. Lane 1 of
    the 2-lane shape is a masked spare (a single-lane atomic has hung on gfx950: the module's
    note)."""
    lane = tl.arange(0, 2)
    first = lane == 0
    ones = tl.full([2], 1, tl.int32)
    # every thread's writes before the one thread's arrival (as `signal`)
    tl.debug_barrier()
    if SYS:
        old = tl.atomic_add(cnt_ptr + lane, ones, mask=first, sem="acq_rel", scope="sys")
    else:
        old = tl.atomic_add(cnt_ptr + lane, ones, mask=first, sem="acq_rel", scope="gpu")
    return tl.sum(tl.where(first, old, 0), 0) == wrap32(target) - 1


@triton.jit
def arrive_flag(cnt_ptr, flag_ptr, target, SYS: tl.constexpr):
    """Arrive on a hand-off whose waiters poll a flag (`wait_flag`): add 1 to the int32 counter
    at cnt_ptr; the arrival that makes it `target` (modulo 2**32) stores target in the flag
    word at flag_ptr. Returns whether this program made that arrival (it need not wait).

    The form of `stages.handoff.grid_handoff_flag` with the guard's deadline and abort flag:
    every program makes one RMW on the counter (`arrive_last`; `wait_ge` polls it with RMWs,
    which serialise with the arrivals at its L2 slice). The last arrival's release of the flag
    carries the others' writes: it acquired their release-adds, and happens-before is
    transitive."""
    lane = tl.arange(0, 2)
    first = lane == 0
    tgt = wrap32(target)
    ones = tl.full([2], 1, tl.int32)
    last = arrive_last(cnt_ptr, target, SYS)
    if last:
        if SYS:
            tl.atomic_xchg(flag_ptr + lane, ones * tgt, mask=first, sem="release", scope="sys")
        else:
            tl.atomic_xchg(flag_ptr + lane, ones * tgt, mask=first, sem="release", scope="gpu")
    return last


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _peek_flag(ptrs, pick, tgt):
    """One poll of `wait_flag`: every lane's volatile load (the flag on the `pick` lanes, the
    abort flag on the others), reduced over the whole program to one value: bit 0 a flag lane
    saw `tgt`, bit 1 an abort lane saw a raised abort flag."""
    v = tl.load(ptrs, volatile=True)
    code = tl.where(pick, (v == tgt).to(tl.int32), (v != 0).to(tl.int32) * 2)
    return tl.reduce(code, 0, _or), v


@triton.jit
def wait_flag(flag_ptr, target, abort_ptr, abort_tab, err_ptr, rank, program, stage, deadline,
              NRANK: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, SYS: tl.constexpr,
              LANES: tl.constexpr = 128):
    """Wait until the flag word `arrive_flag` publishes equals `target` (modulo 2**32), with
    `wait_ge`'s deadline, abort flag and one verdict a program. The polls are volatile loads of
    the flag and the abort flag (plain reads: hundreds of waiters do not serialise at the L2);
    they order nothing, so one acquire RMW of the flag follows a seen target (it reads from the
    release exchange or later, and synchronises with it). Equality: the flag holds the previous
    target until this one is published, never more while this program has not arrived again.
    sm_90 and the interpreter only: a volatile load polled in a loop has hung on gfx950.

    A load's value is the loading thread's own, so each poll is reduced over LANES lanes (at
    least the program's threads: 128 at 4 warps) to one program value, as the module's rule
    asks. Polled on 2 lanes, each warp read the flag itself and left the loop on its own
    iteration, while the deadline's clock reading (`_waited`) holds a barrier every
    CLOCK_EVERY polls: warps paired barriers across different code, and the layer kernel with
    `handoff_flag` hung or faulted on the H200 (session 20)."""
    lane = tl.arange(0, LANES)
    pick = (lane % 2) == 0
    tgt = wrap32(target)
    ptrs = tl.where(pick, flag_ptr, abort_ptr)
    start = program_now(CLOCK)
    seen, v = _peek_flag(ptrs, pick, tgt)
    iters = 0
    waited = tl.full([], 0, tl.int64)
    while (seen == 0) & (waited < deadline):
        seen, v = _peek_flag(ptrs, pick, tgt)
        iters += 1
        waited = _waited(waited, start, iters, CLOCK)
    # bit 0 alone: the target seen and no abort flag raised
    ok = seen == 1
    if ok:
        two = tl.arange(0, 2)
        zero = tl.zeros([2], tl.int32)
        if SYS:
            tl.atomic_add(flag_ptr + two, zero, mask=two == 0, sem="acquire", scope="sys")
        else:
            tl.atomic_add(flag_ptr + two, zero, mask=two == 0, sem="acquire", scope="gpu")
    else:
        # program values for the error word: lane 0's flag reading, lane 1's abort flag
        cur = tl.sum(tl.where(lane == 0, v, 0), 0)
        ab = tl.sum(tl.where(lane == 1, v, 0), 0)
        _fail(ab, cur, tgt, 0, waited, _stop_stamp(start, waited, CLOCK), abort_tab, err_ptr, rank, program, stage,
              NRANK, FAULT, CLOCK)
    # the threads other than the acquiring one read data the producers wrote: order after it
    tl.debug_barrier()
    return ok


@triton.jit
def wait_all_ge(cnt_ptrs, targets, abort_ptr, abort_tab, err_ptr, rank, program, stage, deadline,
                NRANK: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, SYS: tl.constexpr):
    """Wait until every int32 counter of the 1-D pointer tensor `cnt_ptrs` reaches its target
    (modulo 2**32, as `wait_ge`).

    `targets` is a scalar or a tensor shaped like `cnt_ptrs`. Pointers must be distinct (pad
    lanes may repeat a real counter with its real target). The error word's lane is the first
    counter still short. One verdict for the whole program, as `wait_ge`."""
    lanes = tl.arange(0, cnt_ptrs.shape[0])
    tgt = (tl.zeros(cnt_ptrs.shape, tl.int64) + targets).to(tl.int32)
    a2 = tl.arange(0, 2)
    # abort_ptr + 1 is the spare word, so the abort poll has two distinct lanes too.
    aptrs = abort_ptr + a2
    start = program_now(CLOCK)
    v = poll(cnt_ptrs, SYS)
    ab = tl.max(poll(aptrs, SYS), 0)
    short = tl.sum(((v - tgt) < 0).to(tl.int32), 0)
    iters = 0
    waited = tl.full([], 0, tl.int64)
    while (short > 0) & (ab == 0) & (waited < deadline):
        v = poll(cnt_ptrs, SYS)
        ab = tl.max(poll(aptrs, SYS), 0)
        short = tl.sum(((v - tgt) < 0).to(tl.int32), 0)
        iters += 1
        waited = _waited(waited, start, iters, CLOCK)
    ok = (short == 0) & (ab == 0)
    if not ok:
        big = cnt_ptrs.shape[0]
        first = tl.min(tl.where((v - tgt) < 0, lanes, big), 0)
        first = tl.where(first == big, 0, first)
        obs = tl.sum(tl.where(lanes == first, v, 0), 0)
        exp = tl.sum(tl.where(lanes == first, tgt, 0), 0)
        _fail(ab, obs, exp, first, waited, _stop_stamp(start, waited, CLOCK), abort_tab, err_ptr, rank, program, stage,
              NRANK, FAULT, CLOCK)
    tl.debug_barrier()
    return ok


@triton.jit
def aborted(abort_ptr, SYS: tl.constexpr):
    """True when the abort flag is up (for long stages that want to stop early)."""
    return tl.max(poll(abort_ptr + tl.arange(0, 2), SYS), 0) != 0
