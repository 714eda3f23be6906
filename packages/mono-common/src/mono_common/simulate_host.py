"""Host driver for the single-GPU R-rank all-reduce simulation, and its torch reference.

`SimAllReduce` allocates each simulated rank's mailbox, flags and scratch separately, builds
the address tables a real TP launch gets from mono_common.peer's IPC-shared pools, and launches
`mono_common.device.simulate.sim_allreduce_kernel` fused (GPU) or phase by phase (the
interpreter). Buffers are zeroed once at construction; launches never reset anything.
"""

from __future__ import annotations

from mono_common.guard_host import Guard


def next_pow2(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def reference_allreduce_rmsnorm(parts, resid, weight, eps):
    """Torch reference: fp32 sum over ranks in order 0..R-1, residual add, SGLang-style RMSNorm.

    parts: [R, M, W]; resid: [M, W]. Returns (new_residual, out) in resid's dtype."""
    import torch

    acc = parts[0].float()
    for q in range(1, parts.shape[0]):
        acc = acc + parts[q].float()
    h = acc + resid.float()
    new_resid = h.to(resid.dtype)
    var = (h * h).mean(-1, keepdim=True)
    out = (new_resid.float() * torch.rsqrt(var + eps) * weight.float()).to(resid.dtype)
    return new_resid, out


class SimAllReduce:
    """R simulated ranks of P programs each, all-reducing [M, W] partials."""

    def __init__(self, R: int, M: int, W: int, *, P: int = 16, BLOCK_N: int = 256,
                 dtype=None, device=None, guard: Guard | None = None, sys_scope: bool = True,
                 num_warps: int = 4):
        import torch

        if W % BLOCK_N:
            raise ValueError(f"W={W} must be a multiple of BLOCK_N={BLOCK_N}")
        self.R, self.M, self.W, self.P, self.BLOCK_N = R, M, W, P, BLOCK_N
        self.BLOCK_M = max(2, next_pow2(M))
        self.RP2 = max(2, next_pow2(R))
        self.NBLK = W // BLOCK_N
        self.dtype = dtype or torch.bfloat16
        self.guard = guard or Guard(R, device=device, mode="report")
        self.device = self.guard.device
        self.sys_scope = sys_scope
        self.num_warps = num_warps
        dev = self.device
        # One allocation per rank, as peers have: nothing may rely on buffers being adjacent.
        self.mbox = [torch.zeros(2, R, self.BLOCK_M, W, dtype=self.dtype, device=dev) for _ in range(R)]
        self.flags = [torch.zeros(R, self.NBLK, dtype=torch.int32, device=dev) for _ in range(R)]
        self.mbox_tab = torch.tensor([t.data_ptr() for t in self.mbox], dtype=torch.int64, device=dev)
        self.flag_tab = torch.tensor([t.data_ptr() for t in self.flags], dtype=torch.int64, device=dev)
        self.ssq = torch.zeros(R, self.BLOCK_M, self.NBLK, dtype=torch.float32, device=dev)
        self.ssq_cnt = torch.zeros(R, 32, dtype=torch.int32, device=dev)
        self.epochs = torch.zeros(R * P, dtype=torch.int32, device=dev)
        self.delays = torch.zeros(R * P, dtype=torch.int64, device=dev)
        self.resid_out = torch.zeros(R, M, W, dtype=self.dtype, device=dev)
        self.out = torch.zeros(R, M, W, dtype=self.dtype, device=dev)

    def launch(self, parts, resid, weight, eps: float = 1e-5, *, phases: int = 7,
               stall=(-1, -1), delay: bool = False, stage: int = 0):
        """parts [R, M, W]; resid [R, M, W] (each rank's copy of the residual); weight [W]."""
        from mono_common.device.simulate import sim_allreduce_kernel

        g = self.guard
        sim_allreduce_kernel[(self.R * self.P,)](
            parts, resid, self.resid_out, self.out, weight, self.M, eps,
            self.epochs, self.mbox_tab, self.flag_tab, self.ssq, self.ssq_cnt,
            g.abort, g.abort_tab, g.errors, g.deadline,
            stall[0] * self.P + stall[1] if stall[0] >= 0 else -1, self.delays,
            P=self.P, W=self.W, BLOCK_N=self.BLOCK_N, BLOCK_M=self.BLOCK_M, R=self.R, RP2=self.RP2,
            CLOCK=g.clock, FAULT=g.fault, SYS=self.sys_scope, PHASES=phases, DELAY=delay, STAGE=stage,
            num_warps=self.num_warps,
        )

    def run(self, parts, resid, weight, eps: float = 1e-5, *, staged: bool = False, **kw):
        """One all-reduce; staged=True runs the three phases as three launches."""
        if staged:
            for ph in (1, 2, 4):
                self.launch(parts, resid, weight, eps, phases=ph, **kw)
        else:
            self.launch(parts, resid, weight, eps, **kw)
        return self.resid_out, self.out
