"""Grid hand-offs that `mono bench stages` times beside `entries.grid_handoff` (issue 19): one
whose waiters poll a flag with plain loads (`grid_handoff_flag`), one whose arrivals are
spread over S counters that the waiters poll with RMWs or acquire loads (`grid_handoff_split`),
both measured slower than the counter hand-off (their docstrings say by how much), and one
whose poll is one thread's loop with no barrier a poll (`grid_handoff_spin`, sm_90, not yet
timed on a GPU).

`entries.grid_handoff` has every program poll the arrival counter with an atomic RMW, and the
arrivals are RMWs on the same word: RMWs on one address serialise at its L2 slice, so each
arrival queues behind the polls of hundreds of programs. Here each program makes ONE RMW on
the counter (its arrival); the last arriver publishes the hand-off in a separate flag word,
which the others poll with volatile loads (reads do not serialise), then read once with an
acquire RMW.

bar_ptr: BAR_WORDS int32 words, zero at launch (the host zeroes the whole buffer): the counter
at word 0 (word 1 a spare zero), the flag at word FLAG_WORD (another 128-byte line, so its
polls do not share the counter's line; word FLAG_WORD + 1 a spare zero). Targets grow per
hand-off as in `grid_handoff` (the k-th hand-off of a launch on nprog programs: k * nprog),
compared modulo 2**32. Every program of the grid must be resident (a cooperative launch).
Bench-only: no deadline, no abort flag (layers use `guard.wait_ge`).

AMD (constexpr, set by the host for a ROCm device, by the compile tests for gfx950): the
polling load also carries the ".cv" cache modifier. Triton's AMD backend drops `volatile` on
its own (no cache bits), and LLVM then hoists the loop-invariant load out of the poll loop, a
hang (seen in the gfx950 assembly); with ".cv" the load is re-issued each iteration with
sc0 sc1 (past the CU's cache). NVIDIA must not have it: ptxas refuses `.volatile` with `.cv`.
"""

import triton
import triton.language as tl

from mono_common.device.guard import poll, signal, wrap32
from mono_common.device.timer import PROGRAM_LANES

FLAG_WORD = tl.constexpr(32)  # 128 bytes past the counter
BAR_WORDS = 64  # int32 words of a bar buffer that either hand-off can use
LINE_WORDS = tl.constexpr(32)  # int32 words of a 128-byte line: one split counter a line
SPLIT_MAX = 8  # counters `grid_handoff_split` spreads the arrivals over, at most
# int32 words of a bar buffer for `grid_handoff_split`: a line a counter and one for its abort word
SPLIT_WORDS = (SPLIT_MAX + 1) * LINE_WORDS.value


@triton.jit
def _peek(flag, first, AMD: tl.constexpr):
    """The flag word's value by a plain (non-RMW) load that is re-issued every call."""
    if AMD:
        v = tl.load(flag, volatile=True, cache_modifier=".cv")
    else:
        v = tl.load(flag, volatile=True)
    return tl.sum(tl.where(first, v, 0), 0)


@triton.jit
def grid_handoff_flag(bar_ptr, target, AMD: tl.constexpr = False):
    """Arrive on the counter at bar_ptr; the program that makes it `target` publishes `target`
    in the flag word, the others wait for it there. Measured slower than `entries.grid_handoff`
    (H100, session 30: 2.51 us a hand-off on 264 programs against 1.48, 1.85 on 132 against
    1.04): the last arrival's RMW, its flag store and the waiters' next load are three round
    trips in a row where the counter's last arrival and a poll are two."""
    # 2-lane shapes with a masked spare lane: a single-lane atomic or volatile load polled in a
    # loop has hung on gfx950 (guard's comments); the results reach every warp through tl.sum.
    lane = tl.arange(0, 2)
    first = lane == 0
    tgt = (tl.full([], 0, tl.int64) + target).to(tl.int32)
    ones = tl.full([2], 1, tl.int32)
    # every thread's writes of the stage before the one thread's arrival (as guard.signal)
    tl.debug_barrier()
    # acq_rel, not only release: the last arriver's release of the flag must carry every other
    # program's writes, and it does only if its arrival acquires their release-adds (the RMWs
    # on the counter form one release sequence, so the last RMW reads from all of them; then
    # happens-before is transitive: writes -> their add -> last add -> flag store -> reader)
    old = tl.atomic_add(bar_ptr + lane, ones, mask=first, sem="acq_rel", scope="gpu")
    prev = tl.sum(tl.where(first, old, 0), 0)
    flag = bar_ptr + FLAG_WORD + lane
    if prev == tgt - 1:
        tl.atomic_xchg(flag, ones * tgt, mask=first, sem="release", scope="gpu")
    else:
        # Relaxed polling: a volatile load is a plain (non-RMW) read at the L2, so hundreds of
        # waiters do not serialise with each other or with the publisher. It orders nothing,
        # so one acquire RMW of the flag follows: by coherence it reads the published value
        # (or a later one, impossible before this program arrives again), i.e. it reads from
        # the release exchange and synchronises with it. Equality, not >=: the flag holds the
        # previous target until this one, never more while this program has not arrived again.
        cur = _peek(flag, first, AMD)
        while cur != tgt:
            cur = _peek(flag, first, AMD)
        tl.atomic_add(flag, ones * 0, mask=first, sem="acquire", scope="gpu")
    # prev is a program value (one branch a program); in the poll each warp reads the flag
    # itself, but it only leaves on the target and the loop holds no barrier, so warps that
    # see it at different times cannot pair barriers across code. Here every warp leaves
    # together, and the threads that did not make the acquire read order their reads after it.
    tl.debug_barrier()


@triton.jit
def load_acquire(ptrs, LD: tl.constexpr):
    """The int32 at each pointer of `ptrs`, read with acquire semantics at GPU scope. LD (sm_90
    only): by every thread for itself with a plain load (`ld.acquire.gpu`, no read-modify-
    write); otherwise `guard.poll` (one atomic per distinct address, its result broadcast)."""
    if LD:
        addr = ptrs.to(tl.pointer_type(tl.int32)).to(tl.int64, bitcast=True)
        v = tl.inline_asm_elementwise("ld.acquire.gpu.global.b32 $0, [$1];", "=r,l", [addr],
                                      dtype=tl.int32, is_pure=False, pack=1)
    else:
        v = poll(ptrs, False)
    return v


@triton.jit
def _split_distance(ptrs, lane, tgt, S: tl.constexpr, LD: tl.constexpr):
    """How far the S counters' sum is past the target (int32, modulo 2**32), one value for the
    program: with LD each warp's loads differ, so the smallest distance any warp saw goes
    through shared memory (as a guarded wait must make its loop condition program-wide)."""
    d = tl.sum(tl.where(lane < S, load_acquire(ptrs, LD), 0), 0) - tgt
    if LD:
        d = tl.min(tl.full([PROGRAM_LANES], 0, tl.int32) + d, 0)
    return d


@triton.jit
def grid_handoff_split(pid, bar_ptr, target, S: tl.constexpr, LD: tl.constexpr):
    """A counter hand-off in the guarded wait's shape (every poll one value for the program;
    no deadline) with its arrivals spread over S counters: program pid arrives on counter
    pid % S (a release add; counter j at word j * LINE_WORDS of bar_ptr, its own 128-byte line,
    so the counters' RMWs queue at different L2 slices), then polls the S counters (acquire
    loads when LD, sm_90; RMWs otherwise) until their sum reaches `target` (modulo 2**32). The
    counters only grow, so a sum of values read at different moments that reaches the target
    means every arrival of this hand-off happened. The poll's spare lanes read word S *
    LINE_WORDS, which stays zero. Targets as `grid_handoff`'s (the k-th hand-off of a launch on
    nprog programs: k * nprog). bar_ptr holds S * LINE_WORDS + 2 words, zero at launch.

    Measured slower than `entries.grid_handoff` on an H100 (session 30, 264 programs: 1.48 us
    a hand-off against 1.90 with one counter polled by loads, 2.28 / 3.61 over 2 / 8 counters
    polled by loads, 4.41 over 8 polled by RMWs): kept as the bench's evidence."""
    NL: tl.constexpr = 2 if S == 1 else (4 if S <= 3 else (8 if S <= 7 else 16))
    lane = tl.arange(0, NL)
    tgt = wrap32(target)
    if S == 1:
        signal(bar_ptr, 1, False)
    else:
        signal(bar_ptr + (pid % S) * LINE_WORDS, 1, False)
    ptrs = tl.where(lane < S, bar_ptr + lane * LINE_WORDS, bar_ptr + S * LINE_WORDS)
    d = _split_distance(ptrs, lane, tgt, S, LD)
    while d < 0:
        d = _split_distance(ptrs, lane, tgt, S, LD)
    tl.debug_barrier()


# One thread of the program polls in a loop of its own (sm_90; the labels are local to the
# braces, so the block can be inlined many times in one kernel). $1: the counter's address, $2:
# the target; the loop leaves when counter - target >= 0 in int32 (modulo 2**32, as `wrap32`).
_SPIN_HEAD = ("{\n.reg .pred p, q;\n.reg .b32 t, v;\nmov.u32 t, %tid.x;\nsetp.ne.u32 q, t, 0;\n"
              "@q bra DONE;\nLOOP:\n")
_SPIN_TAIL = "sub.s32 v, v, $2;\nsetp.lt.s32 p, v, 0;\n@p bra LOOP;\nDONE:\nmov.u32 $0, 0;\n}"
_SPIN_RMW = tl.constexpr(_SPIN_HEAD + "atom.acquire.gpu.global.add.u32 v, [$1], 0;\n" + _SPIN_TAIL)
_SPIN_LD = tl.constexpr(_SPIN_HEAD + "ld.acquire.gpu.global.b32 v, [$1];\n" + _SPIN_TAIL)


@triton.jit
def spin_until(cnt_ptr, target, LD: tl.constexpr):
    """Thread 0 of the program polls the int32 counter at cnt_ptr until it reaches `target`
    (modulo 2**32) with acquire RMWs of zero (LD: acquire loads) in a loop of its own; every
    other thread passes at once. The caller's barrier after it holds the program until thread
    0 leaves and orders the other threads' reads after its acquire. sm_90 inline assembly."""
    addr = cnt_ptr.to(tl.pointer_type(tl.int32)).to(tl.int64, bitcast=True)
    if LD:
        r = tl.inline_asm_elementwise(_SPIN_LD, "=r,l,r", [addr, wrap32(target)], dtype=tl.int32,
                                      is_pure=False, pack=1)
    else:
        r = tl.inline_asm_elementwise(_SPIN_RMW, "=r,l,r", [addr, wrap32(target)], dtype=tl.int32,
                                      is_pure=False, pack=1)
    return r


@triton.jit
def grid_handoff_spin(bar_ptr, target, LD: tl.constexpr):
    """`entries.grid_handoff` with its poll in one thread (`spin_until`): arrive (`guard.signal`,
    release), thread 0 polls the counter at bar_ptr until `target` arrivals while the other
    threads wait at the barrier after it. The counter form's poll is a 2-lane atomic whose
    result reaches every warp through shared memory, ~92 instructions and 5 barriers a poll in
    the layer's guarded form (sm_90 SASS, Triton 3.6); here a poll is the RMW (LD: the load)
    and a compare. Targets and bar_ptr as `grid_handoff` (2 int32 words, the counter at word
    0). Bench-only (no deadline, no abort flag) and sm_90 only."""
    signal(bar_ptr, 1, False)
    spin_until(bar_ptr, target, LD)
    tl.debug_barrier()
