"""Every runtime helper compiles for gfx950 and sm_90 on the CPU, without spills, and the wait
loop polls with an atomic inside the loop (not a load hoisted out of it) on both ISAs."""

import re

import pytest

triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from mono_common import compilecheck as cc  # noqa: E402
from mono_common.device import guard  # noqa: E402
from mono_common.device.chain import chain_kernel  # noqa: E402
from mono_common.device.epochs import epoch_begin  # noqa: E402
from mono_common.device.simulate import sim_allreduce_kernel  # noqa: E402

CLOCK = {"gfx950": 1, "sm_90": 0}


@triton.jit
def probe_kernel(cnt_ptr, cnts_ptr, target, abort_ptr, abort_tab, err_ptr, out_ptr, deadline,
                 NRANK: tl.constexpr, CLOCK: tl.constexpr, FAULT: tl.constexpr, SYS: tl.constexpr,
                 VEC: tl.constexpr):
    pid = tl.program_id(0)
    if VEC:
        ok = guard.wait_all_ge(cnts_ptr + tl.arange(0, 4) * 32, target, abort_ptr, abort_tab, err_ptr,
                               0, pid, 7, deadline, NRANK, CLOCK, FAULT, SYS)
    else:
        ok = guard.wait_ge(cnt_ptr, target, abort_ptr, abort_tab, err_ptr, 0, pid, 7, deadline,
                           NRANK, CLOCK, FAULT, SYS)
    if ok:
        guard.signal(cnt_ptr + 32, 1, SYS)
        tl.store(out_ptr + pid, guard.aborted(abort_ptr, SYS).to(tl.int32))


@triton.jit
def epoch_view_kernel(epochs_ptr, out_ptr, BLOCK: tl.constexpr):
    # every thread stores the epoch it holds, so a warp that saw another value shows
    pid = tl.program_id(0)
    e = epoch_begin(epochs_ptr + pid)
    tl.store(out_ptr + pid * BLOCK + tl.arange(0, BLOCK), tl.zeros([BLOCK], tl.int32) + e)


PROBE_SIG = dict(cnt_ptr="*i32", cnts_ptr="*i32", target="i32", abort_ptr="*i32", abort_tab="*i64",
                 err_ptr="*i64", out_ptr="*i32", deadline="i64")
CHAIN_SIG = dict(data_ptr="*i32", cnt_ptr="*i32", epochs_ptr="*i32", result_ptr="*i32", delays_ptr="*i64",
                 nstage="i32", abort_ptr="*i32", abort_tab="*i64", err_ptr="*i64", deadline="i64",
                 stall_program="i32")
SIM_SIG = dict(part_ptr="*bf16", resid_ptr="*bf16", resid_out_ptr="*bf16", out_ptr="*bf16", w_ptr="*bf16",
               M="i32", eps="fp32", epochs_ptr="*i32", mbox_tab="*i64", flag_tab="*i64", ssq_ptr="*fp32",
               ssq_cnt_ptr="*i32", abort_ptr="*i32", abort_tab="*i64", err_ptr="*i64", deadline="i64",
               stall_pid="i32", delays_ptr="*i64")


def _check(res, record, max_spills=0):
    # printed at the end of the run by the mono pytest plugin (a print from an xdist worker is lost)
    record("resources", cc.format_resources(res))
    assert res.spills <= max_spills, f"{res.target} {res.name} spills {res.spills} (budget {max_spills})"
    assert res.max_resident() >= 1
    return res


@pytest.mark.parametrize("target", cc.TARGETS)
@pytest.mark.parametrize("vec", [0, 1])
@pytest.mark.parametrize("fault,sys_scope,nrank", [(0, 0, 1), (1, 1, 8)])
def test_probe_compiles(target, vec, fault, sys_scope, nrank, record_property):
    _check(cc.compile_kernel(probe_kernel, PROBE_SIG,
                             dict(NRANK=nrank, CLOCK=CLOCK[target], FAULT=fault, SYS=sys_scope, VEC=vec), target),
           record_property)


@pytest.mark.parametrize("target", cc.TARGETS)
@pytest.mark.parametrize("fault,delay,check", [(0, 0, 0), (1, 1, 1)])
def test_chain_compiles(target, fault, delay, check, record_property):
    _check(cc.compile_kernel(chain_kernel, CHAIN_SIG,
                             dict(G=132, CLOCK=CLOCK[target], FAULT=fault, DELAY=delay, CHECK=check), target),
           record_property)


@pytest.mark.parametrize("fault", [0, 1])
def test_chain_with_the_spin_wait_compiles_on_sm90_its_poll_inside_its_loop(fault, record_property):
    """`guard.wait_ge_spin` (sm_90 only): thread 0's loop holds the counter's acquire RMW, the
    abort flag's load and the clock, and its labels stay local to the braces (the chain
    inlines the wait in its stage loop; ptxas refuses a label defined twice)."""
    res = cc.compile_kernel(chain_kernel, CHAIN_SIG, dict(G=132, CLOCK=0, FAULT=fault, DELAY=1, CHECK=1, SPIN=True),
                            "sm_90")
    _check(res, record_property)
    # the loop: from its label to the abort exit after its last branch back
    loops = re.findall(r"LOOP:(.*?)ABORT:", res.asm["ptx"], re.S)
    assert loops, "no spin loop in the PTX"
    for body in loops:
        assert "atom.acquire.gpu.global.add.u32" in body and "ld.relaxed.gpu.global.b32" in body
        assert "%globaltimer" in body


@pytest.mark.parametrize("target", cc.TARGETS)
@pytest.mark.parametrize("R", [2, 4, 8])
@pytest.mark.parametrize("phases", [7, 1, 2, 4])
def test_allreduce_compiles(target, R, phases, record_property):
    budget = 0
    if (target, R, phases) == ("sm_90", 4, 1):
        # ptxas (Triton 3.8's) gives the push-only staged variant a 16-byte stack frame at
        # R=4, BLOCK_N=128 (not at R=2, 8 or BLOCK_N=256). Staged launches are for the
        # interpreter and bisecting; the fused variant (phases=7) has no spill.
        # That variant gets a bounded 16 B budget; every other variant must have none.
        budget = 16
    c = dict(P=16, W=6144, BLOCK_N=128, BLOCK_M=8, R=R, RP2=R, CLOCK=CLOCK[target], FAULT=1, SYS=1,
             PHASES=phases, DELAY=1, STAGE=0)
    _check(cc.compile_kernel(sim_allreduce_kernel, SIM_SIG, c, target, num_warps=8), record_property,
           max_spills=budget)


def _loop_lines_amdgcn(asm):
    """Instruction lines of blocks LLVM marks as loop bodies or loop headers."""
    lines, inloop = [], False
    for line in asm.splitlines():
        s = line.strip()
        if re.match(r"^(\.LBB\S+|; %bb\.\d+):", s):
            inloop = "Loop" in s  # "=>This Inner Loop Header" or "in Loop: Header=..."
            continue
        if s.startswith(";"):
            # The loop note may sit on its own line after the label.
            if "in Loop" in s or "Loop Header" in s:
                inloop = True
            continue
        if inloop and s and not s.startswith((";", ".")):
            lines.append(s)
    return lines


def _loop_lines_ptx(ptx):
    # PTX puts a block's "=>This Inner Loop Header" / "in Loop" note on the lines after its label.
    lines, inloop, head = [], False, False
    for line in ptx.splitlines():
        s = line.strip()
        if re.match(r"^\$L__BB\S+:", s):
            inloop, head = "Loop" in s, True
            continue
        if s.startswith("//"):
            if head and "Loop" in s:
                inloop = True
            continue
        head = False
        if inloop and s:
            lines.append(s)
    return lines


@pytest.mark.parametrize("vec", [0, 1])
def test_gfx950_wait_polls_inside_the_loop(vec):
    res = cc.compile_kernel(probe_kernel, PROBE_SIG, dict(NRANK=1, CLOCK=1, FAULT=0, SYS=0, VEC=vec), "gfx950")
    body = _loop_lines_amdgcn(res.asm["amdgcn"])
    assert body, "no loop found in the gfx950 code of the wait"
    # The poll is an atomic in the loop (LLVM may lower an idempotent acquire RMW to an
    # acquire load, which is still issued every iteration and followed by a cache invalidate).
    polls = [x for x in body if re.match(r"global_atomic|global_load_dword\w*\s.*\bsc1\b|buffer_atomic", x)]
    assert polls, "no global atomic / acquire load inside the wait loop:\n" + "\n".join(body)
    assert any(x.startswith("s_memrealtime") for x in body), "the deadline clock is not read in the loop"
    print(f"gfx950 wait loop (vec={vec}) polls:", polls)


@pytest.mark.parametrize("vec", [0, 1])
def test_sm90_wait_polls_inside_the_loop(vec):
    res = cc.compile_kernel(probe_kernel, PROBE_SIG, dict(NRANK=1, CLOCK=0, FAULT=0, SYS=0, VEC=vec), "sm_90")
    body = _loop_lines_ptx(res.asm["ptx"])
    assert any(re.search(r"atom\.global\.gpu\.acquire\.add", x) for x in body), "\n".join(body)
    assert any("%globaltimer" in x for x in body)


@pytest.mark.parametrize("vec", [0, 1])
def test_sm90_wait_failure_path_is_one_call_and_gfx950_keeps_it_inline(vec):
    # A launch fetches its code once per stage, ~0.09-0.25 us a KB on the H200 (mono-glm53
    # results README, session 21): the never-run failure path (~2.5 KB inlined) stays out of
    # the hot code on sm_90 as a call; gfx950 inlines it (a call there spilled SGPRs).
    ptx = cc.compile_kernel(probe_kernel, PROBE_SIG, dict(NRANK=1, CLOCK=0, FAULT=0, SYS=0, VEC=vec),
                            "sm_90").asm["ptx"]
    funcs = ptx.split("// -- End function")
    entry = next(f for f in funcs if ".entry" in f)
    called = [f for f in funcs if re.search(r"\.func\s+\S*_fail_call", f) and "{" in f and ".entry" not in f]
    assert re.search(r"\bcall\.uni\s+\S*_fail_call", entry), "the wait does not call the failure path"
    # the error word's CAS is in the called function, not in the kernel's own code
    cas = r"atom\.global\.acquire\.sys\.cas\.b64"
    assert called and re.search(cas, called[0]), "no failure-path function holding the error word's CAS"
    assert not re.search(cas, entry), "the failure path's error-word CAS is inline in the kernel"
    gcn = cc.compile_kernel(probe_kernel, PROBE_SIG, dict(NRANK=1, CLOCK=1, FAULT=0, SYS=0, VEC=vec),
                            "gfx950").asm["amdgcn"]
    assert "s_swappc" not in gcn and "_fail_call" not in gcn


def _decides_after_exchange(body, clock, barrier, shared_read, branch):
    """In the wait loop's code, every clock read is followed, before the next branch, by a
    barrier and then a read of shared memory: the deadline reaches the loop's branch as one
    value exchanged between the warps, not as each thread's own reading."""
    reads = [i for i, x in enumerate(body) if re.search(clock, x)]
    assert reads, "no clock read in the wait loop:\n" + "\n".join(body)
    for i in reads:
        after = body[i + 1:]
        end = next((j for j, x in enumerate(after) if re.search(branch, x)), len(after))
        after = after[:end]
        bar = next((j for j, x in enumerate(after) if re.search(barrier, x)), None)
        if bar is None or not any(re.search(shared_read, x) for x in after[bar + 1:]):
            return False
    return True


@pytest.mark.parametrize("vec", [0, 1])
@pytest.mark.parametrize("target", cc.TARGETS)
def test_wait_decides_the_deadline_as_one_program(target, vec):
    # Old waits read the clock per thread and branched on it: warps of one program could leave
    # the loop on different polls (one failing while another polled on) and pair their barriers
    # across different code. The deadline must go through a cross-warp exchange first.
    res = cc.compile_kernel(probe_kernel, PROBE_SIG, dict(NRANK=1, CLOCK=CLOCK[target], FAULT=0, SYS=0, VEC=vec),
                            target, num_warps=8)
    if target == "gfx950":
        body = _loop_lines_amdgcn(res.asm["amdgcn"])
        ok = _decides_after_exchange(body, r"^s_memrealtime", r"^s_barrier", r"^ds_read", r"^s_cbranch")
    else:
        body = _loop_lines_ptx(res.asm["ptx"])
        ok = _decides_after_exchange(body, r"%globaltimer", r"^bar\.sync", r"^ld\.shared", r"\bbra\b")
    assert ok, "the wait loop branches on a per-thread clock reading:\n" + "\n".join(body)


def test_modular_compare_is_not_folded():
    # cnt - target < 0 must stay a subtraction and a sign test: with a no-overflow flag LLVM may
    # rewrite it as cnt < target, wrong once targets pass 2**31 (mono_common.device.epochs).
    res = cc.compile_kernel(probe_kernel, PROBE_SIG, dict(NRANK=1, CLOCK=0, FAULT=0, SYS=0, VEC=0), "sm_90")
    llir = res.asm["llir"]
    assert not re.search(r"\bsub nsw i32\b", llir), "an int32 subtraction carries nsw"
    body = _loop_lines_ptx(res.asm["ptx"])
    subs = [i for i, x in enumerate(body) if re.match(r"sub\.s32", x)]
    assert subs and any(re.match(r"setp\.lt\.s32\s+%p\d+, %r\d+, 0;", x) for x in body[subs[-1]:]), "\n".join(body)


def test_digest_covers_runtime_sources():
    from mono_common.device import allreduce, epochs, timer

    d = cc.source_digest(guard, epochs, timer, allreduce)
    assert d == cc.source_digest(allreduce, timer, epochs, guard)
    assert d != cc.source_digest(guard, epochs, timer)


@pytest.mark.parametrize("target", cc.TARGETS)
def test_epoch_begin_reads_the_slot_before_anyone_writes_it(target):
    # Every thread loads the slot and one stores it: a barrier must separate the load from the
    # store, or a late warp reads the advanced epoch (H200: the layer kernel's first launches).
    res = cc.compile_kernel(epoch_view_kernel, dict(epochs_ptr="*i32", out_ptr="*i32"), dict(BLOCK=1024),
                            target, num_warps=8)
    if target == "gfx950":
        # the slot is uniform: a scalar load (the argument loads are s_load_dwordx2/x4)
        code, load, store, barrier = res.asm["amdgcn"], r"s_load_dword\s|global_load", r"global_store", r"s_barrier"
    else:
        code, load, store, barrier = res.asm["ptx"], r"ld\.global", r"st\.global", r"bar\.sync"
    first_store = re.search(store, code)
    assert first_store, code[-3000:]
    loads = list(re.finditer(load, code[:first_store.start()]))
    assert loads, code[:first_store.start()][-3000:]
    between = code[loads[-1].end():first_store.start()]
    assert re.search(barrier, between), f"no {barrier} between the epoch load and its store:\n{between}"
