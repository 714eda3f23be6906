"""Host driver for the counter-linked test kernel (mono_common.device.chain)."""

from __future__ import annotations

from mono_common.guard_host import Guard

COUNTER_STRIDE = 32


class Chain:
    """G programs, up to `max_stage` stages; counters and epochs are zeroed once, here.

    Every launch of one Chain must run the same number of stages: each stage counter is
    expected to have grown by G in every epoch."""

    def __init__(self, G: int, max_stage: int, *, guard: Guard | None = None, device=None,
                 check: bool = True, num_warps: int = 4, spin: bool = False):
        import torch

        self.G, self.max_stage, self.check_values, self.num_warps = G, max_stage, check, num_warps
        self.guard = guard or Guard(1, device=device, mode="report")
        # spin: the waits `guard.wait_ge_spin`, sm_90 inline assembly (clock 0, %globaltimer)
        if spin and self.guard.clock != 0:
            raise ValueError(f"the spin wait is sm_90 inline assembly on %globaltimer: a guard of clock "
                             f"{self.guard.clock} ({self.guard.device}) cannot run it")
        self.spin = spin
        dev = self.guard.device
        self.data = torch.zeros(max_stage, G, dtype=torch.int32, device=dev)
        self.counters = torch.zeros(max_stage, COUNTER_STRIDE, dtype=torch.int32, device=dev)
        self.epochs = torch.zeros(G, dtype=torch.int32, device=dev)
        self.result = torch.zeros(2 * G, dtype=torch.int32, device=dev)
        self.delays = torch.zeros(G * max_stage, dtype=torch.int64, device=dev)

    def launch(self, nstage: int | None = None, *, stall: int = -1, delay: bool = False):
        from mono_common.device.chain import chain_kernel

        g = self.guard
        nstage = self.max_stage if nstage is None else nstage
        if not 0 < nstage <= self.max_stage:
            raise ValueError(f"nstage must be in 1..{self.max_stage}")
        abort, abort_tab, err = g.args(0)
        chain_kernel[(self.G,)](
            self.data, self.counters, self.epochs, self.result, self.delays, nstage,
            abort, abort_tab, err, g.deadline, stall,
            G=self.G, CLOCK=g.clock, FAULT=g.fault, DELAY=delay, CHECK=self.check_values, SPIN=self.spin,
            num_warps=self.num_warps,
        )

    def counter_values(self):
        return self.counters[:, 0].tolist()

    def bad_and_epochs(self):
        r = self.result.view(self.G, 2)
        return r[:, 0].tolist(), r[:, 1].tolist()
