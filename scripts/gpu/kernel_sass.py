#!/usr/bin/env python3
"""Here (no GPU): compiles the CUDA backend's kernels as the backend does (NVRTC, compute_90),
assembles them with ptxas for sm_90 and disassembles the named entries, printing per entry
ptxas's registers and spills and its global loads against the waits on them (see
`round_trips`): few loads per wait means loads issued one round trip to memory at a time, the
pattern that made f16 decode attention 2.7x slower than f32 at 64 rows (docs/benchmarks.md,
2026-12-06).

    scripts/fetch_nvrtc.sh; python3 scripts/gpu/kernel_sass.py attn_decode_many_f16_d4 ...
    python3 scripts/gpu/kernel_sass.py --sass attn_decode_many_f16_d4   # and the disassembly
    python3 scripts/gpu/kernel_sass.py --check   # scripts/test.sh: f16 decode entries wait no
                                                 # more often than their f32 twins

nvdisasm comes from PyPI (nvidia-cuda-nvdisasm) into the git-ignored .cache/nvdisasm.
"""
import argparse, ctypes, glob, os, re, subprocess, sys, tempfile

root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
cu = os.path.join(root, ".cache", "nvrtc", "nvidia", "cu13")
src_dir = os.path.join(root, "crates", "inference", "src", "backend", "cuda")
# The order of backend/cuda/mod.rs `KERNELS`.
SOURCES = ["kernels.cu", "attention.cu", "quant.cu", "gdn.cu", "sample.cu"]


def nvdisasm():
    dest = os.path.join(root, ".cache", "nvdisasm")
    found = glob.glob(os.path.join(dest, "**", "bin", "nvdisasm"), recursive=True)
    if found:
        return found[0]
    os.makedirs(dest, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps",
                    "--disable-pip-version-check", "--only-binary=:all:",
                    "--platform", "manylinux2014_x86_64", "nvidia-cuda-nvdisasm==13.5.37", "-d", dest],
                   check=True)
    whl = glob.glob(os.path.join(dest, "*.whl"))[0]
    subprocess.run([sys.executable, "-m", "zipfile", "-e", whl, dest], check=True)
    exe = glob.glob(os.path.join(dest, "**", "bin", "nvdisasm"), recursive=True)[0]
    os.chmod(exe, 0o755)
    return exe


def compile_cubin(work):
    lib_dir = os.path.join(cu, "lib")
    # NVRTC opens its builtins library by name: load it first from the same folder.
    ctypes.CDLL(os.path.join(lib_dir, "libnvrtc-builtins.so.13.0"), mode=ctypes.RTLD_GLOBAL)
    lib = ctypes.CDLL(os.path.join(lib_dir, "libnvrtc.so.13"))
    src = "".join(open(os.path.join(src_dir, f)).read() for f in SOURCES)
    prog = ctypes.c_void_p()
    if lib.nvrtcCreateProgram(ctypes.byref(prog), src.encode(), b"kernels.cu", 0, None, None):
        sys.exit("nvrtcCreateProgram failed")
    opts = [b"--gpu-architecture=compute_90", b"--std=c++17"]
    rc = lib.nvrtcCompileProgram(prog, len(opts), (ctypes.c_char_p * len(opts))(*opts))
    n = ctypes.c_size_t()
    lib.nvrtcGetProgramLogSize(prog, ctypes.byref(n))
    log = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetProgramLog(prog, log)
    if rc:
        sys.exit("NVRTC: " + log.value.decode())
    lib.nvrtcGetPTXSize(prog, ctypes.byref(n))
    ptx = ctypes.create_string_buffer(n.value)
    lib.nvrtcGetPTX(prog, ptx)
    ptx_path, cubin = os.path.join(work, "k.ptx"), os.path.join(work, "k.cubin")
    open(ptx_path, "wb").write(ptx.value)
    out = subprocess.run([os.path.join(cu, "bin", "ptxas"), "-arch=sm_90", "-v", ptx_path,
                          "-o", cubin], capture_output=True, text=True, check=True)
    return cubin, out.stderr


def regs(operand):
    """The registers an operand names (R4.64 is R4 and R5)."""
    out = set()
    for r, wide in re.findall(r"\bR(\d+)(\.64)?", operand):
        out.update({int(r), int(r) + 1} if wide else {int(r)})
    return out


def round_trips(body):
    """(global loads, waits on them) in the order the instructions are written: a load belongs
    to the epoch it is issued in, and reading the value of a load of the current epoch waits
    for it (a round trip to memory; the loads issued before it are taken to be back too), which
    starts the next epoch. Loops count once, so this compares code shapes, not times."""
    loads, waits, epoch, pending = 0, 0, 0, {}
    for line in body.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9._]*)\s+(.*?);", line)
        if not m:
            continue
        op, args = m.group(1), [a.strip() for a in m.group(2).split(",")]
        # Stores read every operand; other instructions write their first.
        read = args if op.startswith(("ST", "RED")) else args[1:]
        if any(pending.get(r) == epoch for a in read for r in regs(a)):
            waits += 1
            epoch += 1
        if re.match(r"LDG?\.E", op) and args and args[0].startswith("R"):
            r0 = int(args[0][1:])
            n = 4 if op.endswith(".128") else 2 if op.endswith(".64") else 1
            for r in range(r0, r0 + n):
                pending[r] = epoch
            loads += 1
        elif args and not op.startswith(("ST", "RED", "BRA", "BSYNC", "BSSY")):
            for r in regs(args[0]):
                pending.pop(r, None)
    return loads, waits


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("entries", nargs="*", help="kernel entry names (extern \"C\")")
    ap.add_argument("--sass", action="store_true", help="print each entry's disassembly")
    ap.add_argument("--check", action="store_true",
                    help="fail when an f16 decode attention entry waits on its loads more often "
                         "than its f32 twin")
    a = ap.parse_args()
    if a.check:
        a.entries = [f"{kind}_{kv}_d{d}" for kind in ("attn_decode", "attn_decode_many")
                     for d in (1, 2, 4, 8) for kv in ("f16", "f32")]
    if not os.path.exists(os.path.join(cu, "lib", "libnvrtc.so.13")):
        sys.exit("no NVRTC here: run scripts/fetch_nvrtc.sh first")
    with tempfile.TemporaryDirectory() as work:
        cubin, ptxas_log = compile_cubin(work)
        sass = subprocess.run([nvdisasm(), "-c", cubin], capture_output=True, text=True,
                              check=True).stdout
    # Each entry's section runs from its `.text.NAME:` label to the next section.
    sections = re.split(r"\n(?=\s*\.section\s)", sass)
    waits_of, bad = {}, []
    for name in a.entries:
        m = re.search(r"Function properties for %s\n\s*(.*)\n.*?Used (\d+) registers" %
                      re.escape(name), ptxas_log)
        body = next((s for s in sections if re.search(r"^\.text\.%s:" % re.escape(name), s,
                                                       re.M)), None)
        if m is None or body is None:
            print(f"{name}: no such entry")
            continue
        loads, waits = round_trips(body)
        waits_of[name] = waits
        print(f"{name}: {m.group(2)} registers, {m.group(1).strip()}; {loads} global loads, "
              f"{waits} waits on them ({loads / max(waits, 1):.1f} loads per round trip)")
        if a.sass:
            print(body)
    if a.check:
        for name, waits in waits_of.items():
            twin = waits_of.get(name.replace("_f16_", "_f32_"))
            if "_f16_" in name and (twin is None or waits > twin + twin // 10 + 2):
                bad.append(f"{name} waits {waits} times, its f32 twin {twin}")
        print("kernel_sass check: " + ("; ".join(bad) if bad else
                                       f"{len(waits_of) // 2} f16 entries wait no more than f32"))
        sys.exit(1 if bad or len(waits_of) != len(a.entries) else 0)


if __name__ == "__main__":
    main()
