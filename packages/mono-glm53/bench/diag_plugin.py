"""pytest plugin (-p diag_plugin, with this folder on PYTHONPATH) for the session-4 H200 hunt:
after every GlmLayerKernel launch, synchronise and check (1) every cached pointer table still
equals its host source, (2) top-k entries are -1 or below the row's sequence length, (3) the
scratch buffers are finite. Prints one line per violation (and the launch count)."""

import torch

from mono_glm53.kernels import layer

_N = [0]
_orig = layer.GlmLayerKernel.launch


def _launch(self, caches, mode="fused", delay=0, stages=None, weights=None):
    out = _orig(self, caches, mode=mode, delay=delay, stages=stages, weights=weights)
    torch.cuda.synchronize()
    _N[0] += 1
    tag = f"launch {_N[0]} mode={mode} W={self.width} ctx={self.max_seq_len}"
    for dev, host in self._tables.values():
        if not torch.equal(dev.cpu(), host.cpu()):
            diff = (dev.cpu() != host).nonzero().tolist()
            print(f"DIAG TABLE CORRUPT {tag}: slots {diff[:10]}", flush=True)
    if stages is None:
        n = self.seqlen.long()
        t = self.topk.long()
        bad = ((t >= n[:, None]) | (t < -1)).any(dim=1)
        if bool(bad.any()):
            print(f"DIAG TOPK RANGE {tag}: rows {bad.nonzero().flatten().tolist()}", flush=True)
        for name in ("hn", "qkva", "qn", "qb", "qabs", "attn", "op", "h2", "gu", "inter", "out", "res_out"):
            v = getattr(self, name)
            if not bool(torch.isfinite(v.float()).all()):
                print(f"DIAG NONFINITE {tag}: first {name}", flush=True)
                break
    return out


layer.GlmLayerKernel.launch = _launch
