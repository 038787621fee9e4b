"""torchvision MNIST, downloaded once per storage path under a file lock (the driver does it, workers read)."""

from __future__ import annotations

from dataclasses import dataclass

from raytrain.data import DataContext, DataSource, DataUnavailable, splits

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")


@dataclass
class MNIST(DataSource):
    download: bool = True  # false: only use files already staged under <storage>/datasets/MNIST/raw

    def prepare(self, ctx: DataContext) -> None:
        prepare(self, ctx)

    def datasets(self, ctx: DataContext) -> dict:
        from torchvision import transforms
        from torchvision.datasets import MNIST as TorchvisionMNIST

        tf = transforms.Compose([transforms.ToTensor(), transforms.Normalize((0.1307,), (0.3081,))])
        return splits(TorchvisionMNIST(str(ctx.root), train=True, download=False, transform=tf),
                      TorchvisionMNIST(str(ctx.root), train=False, download=False, transform=tf))


def prepare(p: MNIST, ctx: DataContext) -> None:
    from filelock import FileLock
    from torchvision.datasets import MNIST

    ctx.root.mkdir(parents=True, exist_ok=True)
    raw = ctx.root / "MNIST" / "raw"
    with FileLock(str(ctx.root / ".mnist.lock")):
        try:
            MNIST(str(ctx.root), train=True, download=p.download)
            MNIST(str(ctx.root), train=False, download=p.download)
        except Exception as err:  # torchvision raises RuntimeError/URLError/OSError depending on what failed
            reason = " ".join(str(err).split())
            reason = reason if len(reason) <= 160 else reason[:157] + "..."
            raise DataUnavailable(
                f"MNIST is not available under {raw} and could not be downloaded ({reason}). "
                f"Fix: on a machine with internet run `raytrain data mnist --root {ctx.root}`, or copy the files "
                f"{', '.join(f + '.gz' for f in MNIST_FILES)} into {raw}, then run again."
            ) from None
