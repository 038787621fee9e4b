"""PyTorch Lightning under Ray Train, written as Ray Train's Lightning guide writes it (RayDDPStrategy,
RayLightningEnvironment, RayTrainReportCallback, prepare_trainer), and run by `raytrain run lightning.yaml`
unchanged. The model is built from its arguments and the data is generated: nothing is downloaded."""

import os

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ray.train
from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer


class Regressor(pl.LightningModule):
    def __init__(self, hidden: int = 32, lr: float = 1e-2):
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 1))

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True, on_step=False, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def make_dataset(num_samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(num_samples, 8, generator=generator)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1 * torch.randn(num_samples, 1, generator=generator)
    return TensorDataset(x, y)


def train_func(config):
    loader = DataLoader(make_dataset(config.get("num_samples", 1024)), batch_size=config.get("batch_size", 32),
                        shuffle=True)
    model = Regressor(hidden=config.get("hidden", 32), lr=config.get("lr", 1e-2))
    trainer = pl.Trainer(
        max_epochs=config.get("epochs", 5),
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],  # reports each epoch's logged metrics with a checkpoint
        enable_checkpointing=False,  # the callback checkpoints
        enable_progress_bar=False,
        logger=False,
    )
    trainer = prepare_trainer(trainer)
    checkpoint = ray.train.get_checkpoint()  # the newest one raytrain committed, after any restart or rerun
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            ckpt_path = os.path.join(checkpoint_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, train_dataloaders=loader, ckpt_path=ckpt_path)
    else:
        trainer.fit(model, train_dataloaders=loader)


if __name__ == "__main__":  # the same function under plain Ray Train
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer

    print(TorchTrainer(train_func, train_loop_config={"epochs": 3},
                       scaling_config=ScalingConfig(num_workers=2)).fit().metrics)
