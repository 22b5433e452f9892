"""Which OpenBLAS kernel family PyTorch's BLAS should use on this CPU.

Debian's OpenBLAS picks its kernels at load time from the CPU model, and misdetects CPUs newer
than its tables (it then falls back to slow generic kernels, and the parity tests run for
minutes). OPENBLAS_CORETYPE overrides the detection, but naming a core whose instructions the CPU
lacks ends in SIGILL, so the core is chosen from the instruction-set flags the kernel reports in
/proc/cpuinfo: the newest core whose every required flag is present, or none (OpenBLAS detects).
"""
import os

# Newest first: the flags each core's kernels execute.
_AVX512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"}
CORES = [
    ("Cooperlake", _AVX512 | {"avx512_bf16", "avx2", "fma"}),
    ("SkylakeX", _AVX512 | {"avx2", "fma"}),
    ("Haswell", {"avx2", "fma"}),
]


def cpu_flags(cpuinfo="/proc/cpuinfo"):
    """The flags of the first processor, or an empty set where the file is absent (not Linux)."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def coretype(flags):
    """The newest core in CORES that `flags` fully support, or None."""
    for name, needed in CORES:
        if needed <= flags:
            return name
    return None


def configure(environ=os.environ, cpuinfo="/proc/cpuinfo"):
    """Sets OPENBLAS_CORETYPE before torch loads OpenBLAS, unless the caller already chose one."""
    if "OPENBLAS_CORETYPE" in environ:
        return environ["OPENBLAS_CORETYPE"]
    core = coretype(cpu_flags(cpuinfo))
    if core:
        environ["OPENBLAS_CORETYPE"] = core
    return core


if __name__ == "__main__":  # for shell scripts: prints the core to use, or nothing
    print(coretype(cpu_flags()) or "")
