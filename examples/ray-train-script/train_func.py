"""A Ray Train training function written the way Ray's docs teach it (ray.train.report with a Checkpoint,
ray.train.get_checkpoint to resume, prepare_model and prepare_data_loader). Nothing in it knows raytrain:
TorchTrainer(train_func, train_loop_config={...}) runs it as well as `raytrain run job.yaml` does."""

import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ray.train
import ray.train.torch
from ray.train import Checkpoint


def make_dataset(num_samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_samples, 8, generator=generator)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(x, y)


def train_func(config):
    loader = DataLoader(make_dataset(config.get("num_samples", 1024)), batch_size=config.get("batch_size", 32),
                        shuffle=True)
    loader = ray.train.torch.prepare_data_loader(loader)
    hidden = config.get("hidden", 32)
    model = ray.train.torch.prepare_model(nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=config.get("lr", 1e-2))
    loss_fn = nn.MSELoss()

    # Resume: Ray Train hands back the latest reported checkpoint after a failure or a restart.
    start_epoch = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, "checkpoint.pt"))
        getattr(model, "module", model).load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1

    for epoch in range(start_epoch, config.get("epochs", 10)):
        if ray.train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        model.train()
        total, count = 0.0, 0
        for x, y in loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total, count = total + loss.item() * len(y), count + len(y)

        metrics = {"epoch": epoch, "loss": total / count}
        with tempfile.TemporaryDirectory() as tmpdir:
            checkpoint = None
            if ray.train.get_context().get_world_rank() == 0:  # one copy of DDP's identical weights
                torch.save({"epoch": epoch, "model": getattr(model, "module", model).state_dict(),
                            "optimizer": optimizer.state_dict()}, os.path.join(tmpdir, "checkpoint.pt"))
                checkpoint = Checkpoint.from_directory(tmpdir)
            ray.train.report(metrics, checkpoint=checkpoint)


if __name__ == "__main__":  # the same function under plain Ray Train
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    result = TorchTrainer(train_func, train_loop_config={"lr": 0.01, "epochs": 10},
                          scaling_config=ScalingConfig(num_workers=2)).fit()
    print(result.metrics)
