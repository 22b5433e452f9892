#!/usr/bin/env python3
"""Checks of the parity harness itself, runnable without PyTorch:

  - the OpenBLAS core is only forced where the CPU has every instruction set it implies;
  - parity.py without PyTorch fails with a message that names the package to install.

  self_test.py PARITY_PY WORKDIR
"""
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import openblas_coretype as ob  # noqa: E402

parity, work = sys.argv[1], sys.argv[2]
os.makedirs(work, exist_ok=True)
failures = []


def check(ok, what):
    if not ok:
        failures.append(what)


avx512 = {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd", "avx2", "fma", "sse4_2"}
check(ob.coretype(avx512 | {"avx512_bf16"}) == "Cooperlake", "Cooperlake with avx512_bf16")
check(ob.coretype(avx512) == "SkylakeX", "AVX-512 without bf16 must not get Cooperlake")
check(ob.coretype(avx512 - {"avx512vl"}) == "Haswell", "AVX-512 without VL is no SkylakeX")
check(ob.coretype({"avx2", "fma", "sse4_2"}) == "Haswell", "AVX2 only")
check(ob.coretype({"sse4_2", "avx512_bf16"}) is None, "no AVX2: leave the detection to OpenBLAS")

with tempfile.TemporaryDirectory(dir=work) as tmp:
    cpuinfo = os.path.join(tmp, "cpuinfo")
    with open(cpuinfo, "w") as f:
        f.write("processor\t: 0\nflags\t\t: fpu sse4_2 avx2 fma\n\nprocessor\t: 1\nflags\t\t: fpu\n")
    env = {}
    check(ob.configure(env, cpuinfo) == "Haswell" and env == {"OPENBLAS_CORETYPE": "Haswell"}, "from cpuinfo")
    env = {"OPENBLAS_CORETYPE": "Zen"}
    check(ob.configure(env, cpuinfo) == "Zen" and env["OPENBLAS_CORETYPE"] == "Zen", "the caller's choice wins")
    env = {}
    check(ob.configure(env, os.path.join(tmp, "absent")) is None and env == {}, "no cpuinfo: unset")

    # A PyTorch that cannot be imported (a module named torch that raises ImportError, first on the path).
    with open(os.path.join(tmp, "torch.py"), "w") as f:
        f.write("raise ModuleNotFoundError(\"No module named 'torch'\", name='torch')\n")
    r = subprocess.run([sys.executable, parity, "/bin/false", "gpt", os.path.join(tmp, "run")],
                       env=dict(os.environ, PYTHONPATH=tmp), capture_output=True, text=True)
    check(r.returncode != 0, "parity.py without PyTorch must fail")
    check("python3-torch" in r.stderr and "scripts/setup" in r.stderr,
          "parity.py without PyTorch must name the package: " + r.stderr.strip()[-300:])

for f in failures:
    print("FAIL: " + f)
print(f"parity self-test: {'FAIL' if failures else 'ok'}; this CPU: OPENBLAS_CORETYPE={ob.coretype(ob.cpu_flags())}")
sys.exit(1 if failures else 0)
