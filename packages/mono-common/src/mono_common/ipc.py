"""Device memory that other processes map: allocation and IPC handles, through ctypes.

The peer buffers (mono_common.peer) must reach every TP rank's GPU memory from every other
rank's kernels, both across the GPUs of a node and across rank processes that share ONE GPU
(the only way TP runs on the one-GPU test machine). torch symmetric memory refuses two ranks
on one device; CUDA/HIP IPC handles do not: each rank allocates its pool, exports a 64-byte
handle, the handles travel over the TP group's CPU group, and each rank opens its peers'
handles into its own address space with lazy peer access (the pattern SGLang's custom
all-reduce uses).

`runtime()` returns the `DeviceRuntime` of the GPU runtime torch itself loaded (libcudart on
CUDA, libamdhip64 on ROCm, found in /proc/self/maps so the calls share torch's primary context
and current device). Its calls, all on the current device:

  malloc(nbytes, uncached)   -> address   (ROCm + uncached: fine-grained uncached memory, so
                                            polls see other GPUs' writes; CUDA: plain cudaMalloc)
  memset(addr, value, nbytes); synchronize(); free(addr)
  export(addr)               -> bytes     (the 64-byte IPC handle of an allocation's base)
  open(handle)               -> address   (a peer's allocation mapped here; close(addr) unmaps)
  view(addr, nbytes, device) -> a uint8 torch tensor over the memory (owns nothing)

Errors raise `DeviceRuntimeError` naming the call and the runtime's error string.
"""

from __future__ import annotations

import ctypes
import os

HANDLE_BYTES = 64  # cudaIpcMemHandle_t / hipIpcMemHandle_t: 64 reserved bytes
_LAZY_ENABLE_PEER_ACCESS = 0x1  # cudaIpcMemLazyEnablePeerAccess == hipIpcMemLazyEnablePeerAccess
_HIP_DEVICE_MALLOC_UNCACHED = 0x3  # hipDeviceMallocUncached


class IpcHandle(ctypes.Structure):
    """The runtime's IPC handle type, passed by value to the open call."""

    _fields_ = [("reserved", ctypes.c_byte * HANDLE_BYTES)]


class DeviceRuntimeError(RuntimeError):
    """A CUDA/HIP runtime call failed."""


def find_loaded_library(stem: str, maps_text: str | None = None) -> str | None:
    """The path of a loaded shared library whose file name starts with `stem` (e.g.
    "libcudart"), from /proc/self/maps (or `maps_text`); None when none is loaded."""
    if maps_text is None:
        try:
            with open("/proc/self/maps") as f:
                maps_text = f.read()
        except OSError:
            return None
    for line in maps_text.splitlines():
        if "/" not in line:
            continue  # an anonymous mapping
        path = line[line.index("/"):].strip().removesuffix(" (deleted)")
        name = os.path.basename(path)
        # a stub (some JIT loaders ship a libcudart_stub.so) lacks the IPC calls
        if name.startswith(stem + ".so"):
            return path
    return None


class DeviceRuntime:
    """The few CUDA or HIP runtime calls peer buffers need (see the module doc)."""

    def __init__(self, lib, prefix: str, rocm: bool):
        self.lib, self.prefix, self.rocm = lib, prefix, rocm
        c = ctypes
        self._sig("SetDevice", [c.c_int])
        self._sig("Malloc", [c.POINTER(c.c_void_p), c.c_size_t])
        self._sig("Free", [c.c_void_p])
        self._sig("Memset", [c.c_void_p, c.c_int, c.c_size_t])
        self._sig("DeviceSynchronize", [])
        self._sig("IpcGetMemHandle", [c.POINTER(IpcHandle), c.c_void_p])
        self._sig("IpcOpenMemHandle", [c.POINTER(c.c_void_p), IpcHandle, c.c_uint])
        self._sig("IpcCloseMemHandle", [c.c_void_p])
        if rocm:
            self._sig("ExtMallocWithFlags", [c.POINTER(c.c_void_p), c.c_size_t, c.c_uint])
        err = getattr(lib, prefix + "GetErrorString")
        err.argtypes, err.restype = [c.c_int], c.c_char_p
        self._err = err

    def _sig(self, name: str, argtypes) -> None:
        fn = getattr(self.lib, self.prefix + name)
        fn.argtypes, fn.restype = argtypes, ctypes.c_int

    def _call(self, name: str, *args) -> None:
        rc = getattr(self.lib, self.prefix + name)(*args)
        if rc != 0:
            text = self._err(rc)
            raise DeviceRuntimeError(f"{self.prefix}{name} failed: error {rc} "
                                     f"({text.decode() if text else 'unknown'})")

    def set_device(self, index: int) -> None:
        self._call("SetDevice", int(index))

    def malloc(self, nbytes: int, uncached: bool = False) -> int:
        ptr = ctypes.c_void_p()
        if uncached and self.rocm:
            self._call("ExtMallocWithFlags", ctypes.byref(ptr), nbytes, _HIP_DEVICE_MALLOC_UNCACHED)
        else:
            self._call("Malloc", ctypes.byref(ptr), nbytes)
        return int(ptr.value)

    def free(self, addr: int) -> None:
        self._call("Free", ctypes.c_void_p(addr))

    def memset(self, addr: int, value: int, nbytes: int) -> None:
        self._call("Memset", ctypes.c_void_p(addr), int(value), nbytes)

    def synchronize(self) -> None:
        self._call("DeviceSynchronize")

    def export(self, addr: int) -> bytes:
        h = IpcHandle()
        self._call("IpcGetMemHandle", ctypes.byref(h), ctypes.c_void_p(addr))
        return bytes(h.reserved)

    def open(self, handle: bytes) -> int:
        if len(handle) != HANDLE_BYTES:
            raise ValueError(f"an IPC handle has {HANDLE_BYTES} bytes, got {len(handle)}")
        h = IpcHandle()
        ctypes.memmove(ctypes.byref(h), handle, HANDLE_BYTES)
        ptr = ctypes.c_void_p()
        self._call("IpcOpenMemHandle", ctypes.byref(ptr), h, _LAZY_ENABLE_PEER_ACCESS)
        return int(ptr.value)

    def close(self, addr: int) -> None:
        self._call("IpcCloseMemHandle", ctypes.c_void_p(addr))

    @staticmethod
    def view(addr: int, nbytes: int, device):
        """A uint8 tensor over [addr, addr + nbytes) on `device`; it does not own the memory."""
        import torch

        class _Memory:
            __cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1", "data": (addr, False),
                                        "version": 3}

        return torch.as_tensor(_Memory(), device=device)


_RUNTIME: DeviceRuntime | None = None


def runtime() -> DeviceRuntime:
    """The runtime torch loaded (initialises torch's CUDA/HIP first); one per process."""
    global _RUNTIME
    if _RUNTIME is None:
        import torch

        torch.cuda.init()
        rocm = bool(getattr(torch.version, "hip", None))
        stem, prefix = ("libamdhip64", "hip") if rocm else ("libcudart", "cuda")
        path = find_loaded_library(stem)
        names = [path] if path else [f"{stem}.so"]
        lib, tried = None, []
        for name in names:
            try:
                lib = ctypes.CDLL(name)
                break
            except OSError as e:
                tried.append(f"{name}: {e}")
        if lib is None:
            raise DeviceRuntimeError(
                f"cannot load the {'HIP' if rocm else 'CUDA'} runtime for IPC peer buffers ({'; '.join(tried)}); "
                f"torch did not load {stem} dynamically")
        _RUNTIME = DeviceRuntime(lib, prefix, rocm)
    return _RUNTIME
