"""Make the CUDA build of torchvision importable next to a CPU-only torch.

PyPI ships torchvision 0.28.0 only as a CUDA build; with the CPU torch wheel its compiled operators fail to
register and `import torchvision` raises. Stubbing the two modules that register those operators makes models,
transforms and datasets work (compiled ops such as nms and image io stay unavailable). This is an environment
workaround installed into the virtual environment as a .pth file, so every process of that interpreter, Ray
workers included, gets it; the training code knows nothing about it.

usage: python scripts/torchvision_cpu_shim.py --install-if-needed | --uninstall
"""

import subprocess
import sys
import sysconfig
from pathlib import Path

PTH_NAME = "raytrain_torchvision_cpu_shim.pth"
STUBBED = ("torchvision._meta_registrations", "torchvision._autograd_registrations")
# A .pth line that starts with "import" is executed at interpreter start-up.
PTH_LINE = (
    "import sys, types; "
    + "; ".join(f"sys.modules.setdefault({name!r}, types.ModuleType({name!r}))" for name in STUBBED)
    + "\n"
)


def torchvision_imports() -> bool:
    probe = subprocess.run([sys.executable, "-c", "import torchvision"], capture_output=True)
    return probe.returncode == 0


def main(argv: list[str]) -> int:
    pth = Path(sysconfig.get_paths()["purelib"]) / PTH_NAME
    if argv == ["--uninstall"]:
        pth.unlink(missing_ok=True)
        return 0
    if argv != ["--install-if-needed"]:
        print(__doc__.strip().splitlines()[-1], file=sys.stderr)
        return 2
    if pth.exists() or torchvision_imports():
        return 0
    pth.write_text(PTH_LINE)
    if not torchvision_imports():
        pth.unlink()
        print("torchvision does not import even with the CPU shim; check the torch/torchvision pins", file=sys.stderr)
        return 1
    print(f"installed {pth} (torchvision CUDA build on CPU torch: compiled ops unavailable)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
