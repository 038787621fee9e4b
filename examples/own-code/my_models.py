"""A model of your own: any callable that returns a torch.nn.Module; its keyword arguments are the config's keys."""

from torch import nn


class TinyConvNet(nn.Module):
    def __init__(self, channels: int = 8, num_classes: int = 4):
        super().__init__()
        if channels < 1:
            raise ValueError(f"channels must be >= 1, got {channels}")
        self.net = nn.Sequential(
            nn.Conv2d(1, channels, 3, padding=1), nn.ReLU(),
            nn.Conv2d(channels, 2 * channels, 3, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * channels, num_classes),
        )

    def forward(self, x):
        return self.net(x)
