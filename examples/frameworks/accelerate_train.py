"""Hugging Face Accelerate under Ray Train, written as Ray Train's Accelerate guide writes it (an `Accelerator` in
the training function; Ray Train sets up the workers and their process group, which Accelerate picks up), and run
by `raytrain run accelerate.yaml` unchanged. The model is built from its arguments and the data is generated."""

import os
import tempfile

import torch
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ray.train
from ray.train import Checkpoint


def make_dataset(num_samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_samples, 8, generator=generator)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(x, y)


def train_func(config):
    accelerator = Accelerator()
    hidden = config.get("hidden", 32)
    model = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 1e-2))
    loader = DataLoader(make_dataset(config.get("num_samples", 1024)), batch_size=config.get("batch_size", 32),
                        shuffle=True)

    # Resume: Ray Train hands back the newest reported checkpoint (raytrain: the newest committed one of the run).
    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    # Accelerate wraps the model for DDP and shards the loader over the workers Ray Train started.
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for epoch in range(start_epoch, config.get("epochs", 5)):
        model.train()
        total, count = torch.zeros(()), 0
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            accelerator.backward(loss)
            optimizer.step()
            total, count = total + loss.detach() * len(y), count + len(y)

        metrics = {"epoch": epoch, "loss": float(total) / count}
        with tempfile.TemporaryDirectory() as tmpdir:
            checkpoint = None
            if accelerator.is_main_process:  # one copy of DDP's identical weights
                torch.save({"epoch": epoch, "model": accelerator.unwrap_model(model).state_dict(),
                            "optimizer": optimizer.state_dict()}, os.path.join(tmpdir, "checkpoint.pt"))
                checkpoint = Checkpoint.from_directory(tmpdir)
            ray.train.report(metrics, checkpoint=checkpoint)


if __name__ == "__main__":  # the same function under plain Ray Train
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    print(TorchTrainer(train_func, train_loop_config={"epochs": 3},
                       scaling_config=ScalingConfig(num_workers=2)).fit().metrics)
