"""`code_prefetch.text_of` / `text_bytes`: an entry's code section found in an ELF64 by name."""

import struct

from mono_common.stages.code_prefetch import text_bytes, text_of


def _elf(sections: dict[str, bytes]) -> bytes:
    """A minimal little-endian ELF64: a null section, the named sections, then .shstrtab."""
    names = b"\0"
    offs = {}
    for n in list(sections) + [".shstrtab"]:
        offs[n] = len(names)
        names += n.encode() + b"\0"
    body = b""
    where = {}
    for n, data in sections.items():
        where[n] = 64 + len(body)
        body += data
    where[".shstrtab"] = 64 + len(body)
    body += names
    shoff = 64 + len(body)
    heads = [struct.pack("<IIQQQQIIQQ", 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)]
    for n in list(sections) + [".shstrtab"]:
        data = names if n == ".shstrtab" else sections[n]
        heads.append(struct.pack("<IIQQQQIIQQ", offs[n], 1 if n != ".shstrtab" else 3, 6, 0, where[n], len(data),
                                 0, 0, 16, 0))
    hdr = bytearray(64)
    hdr[:5] = b"\x7fELF\x02"
    struct.pack_into("<Q", hdr, 0x28, shoff)
    struct.pack_into("<HHH", hdr, 0x3A, 64, len(heads), len(heads) - 1)
    return bytes(hdr) + body + b"".join(heads)


def test_the_named_entry_s_text_is_found_among_others():
    code = bytes(range(256)) * 3
    elf = _elf({".text.other": b"\x01" * 48, ".text.layer_kernel": code, ".nv.info": b"\x02" * 8})
    assert text_of(elf, "layer_kernel") == code
    assert text_bytes(elf, "layer_kernel") == len(code)
    assert text_bytes(elf, "other") == 48


def test_a_missing_entry_or_a_binary_that_is_not_elf64_gives_zero_bytes():
    elf = _elf({".text.other": b"\x01" * 48})
    assert text_bytes(elf, "layer_kernel") == 0
    # a prefix of the name is not the name
    assert text_bytes(_elf({".text.layer_kernel_x": b"\x01" * 16}), "layer_kernel") == 0
    assert text_bytes(b"", "layer_kernel") == 0
    assert text_bytes(b"\x7fELF\x01" + bytes(80), "layer_kernel") == 0  # ELF32
    assert text_bytes(b"hsaco?" * 20, "layer_kernel") == 0
    # section headers past the end of the binary
    bad = bytearray(_elf({".text.layer_kernel": b"\x01" * 16}))
    struct.pack_into("<Q", bad, 0x28, len(bad) + 64)
    assert text_bytes(bytes(bad), "layer_kernel") == 0
