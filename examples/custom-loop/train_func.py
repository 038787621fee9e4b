"""Your own training loop with raytrain's run contract around it: the source material's first example (an MLP
learns y = 2x + 1), rewritten against raytrain.Session. The loop runs on every Ray Train worker."""

import torch
from torch import nn
from torch.utils.data import TensorDataset

import raytrain


def train_func(session: raytrain.Session, hidden: int = 32, num_samples: int = 200) -> None:
    cfg = session.config
    x = (torch.arange(num_samples, dtype=torch.float32) / num_samples).reshape(-1, 1)
    dataset = TensorDataset(x, 2 * x + 1)

    model = session.prepare_model(nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, 1)))
    optimizer = torch.optim.Adam(model.parameters(), lr=cfg.train.lr)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=20, gamma=0.5)
    start = session.restore(model, optimizer, scheduler=scheduler)   # 1, or the epoch after the newest checkpoint

    for epoch in range(start, cfg.train.epochs + 1):
        loss_sum, count = 0.0, 0
        for inputs, targets in session.batches(dataset, epoch):      # this worker's shard of the global batch
            optimizer.zero_grad()
            loss = nn.functional.mse_loss(model(inputs), targets)
            loss.backward()
            optimizer.step()
            loss_sum, count = loss_sum + loss.item() * len(targets), count + len(targets)
        scheduler.step()
        loss_sum, count = session.all_reduce([loss_sum, count])      # the same numbers on every worker
        session.report(epoch, {"train_loss": loss_sum / count, "lr": scheduler.get_last_lr()[0]},
                       model=model, optimizer=optimizer, scheduler=scheduler)


# What a resume may change (raytrain.checkpoint.resume): this loop builds its optimizer from train.lr, so a resume with a new
# train.lr sets it into the restored optimizer; its own `hidden` fixes the model's shape for the life of a run.
train_func.applied_on_resume = ("train.lr",)
train_func.fixed_on_resume = ("loop.hidden",)
