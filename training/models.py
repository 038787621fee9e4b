"""Model builders by name. Each entry declares its parameters (the config's `model` section) and builds a
plain torch.nn.Module; Ray Train wraps it later (prepare_model), the local loop uses it as is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn


@dataclass
class MLPParams:
    in_features: int = 1
    hidden: int = 32
    out_features: int = 1
    layers: int = 1  # hidden layers


@dataclass
class SmallCNNParams:
    in_channels: int = 1
    num_classes: int = 10
    width: int = 32  # channels of the first conv; the second has twice as many
    dropout: float = 0.1


@dataclass
class ViTParams:
    image_size: int = 32
    patch_size: int = 4
    num_layers: int = 12
    num_heads: int = 8
    hidden_dim: int = 384
    mlp_dim: int = 768
    num_classes: int = 10
    dropout: float = 0.0


@dataclass
class TextRNNParams:
    vocab_size: int = 20000  # must cover the data's vocabulary (data.vocab_size)
    embedding_dim: int = 100
    hidden_dim: int = 256
    n_layers: int = 2
    bidirectional: bool = True
    dropout: float = 0.5
    num_classes: int = 4
    cell: str = "lstm"  # lstm | gru | rnn


def build_mlp(p: MLPParams) -> nn.Module:
    layers: list[nn.Module] = []
    width = p.in_features
    for _ in range(p.layers):
        layers += [nn.Linear(width, p.hidden), nn.ReLU()]
        width = p.hidden
    layers.append(nn.Linear(width, p.out_features))
    return nn.Sequential(*layers)


def build_small_cnn(p: SmallCNNParams) -> nn.Module:
    # Global average pooling makes the same network fit 8x8 digits, 28x28 MNIST and 32x32 CIFAR.
    return nn.Sequential(
        nn.Conv2d(p.in_channels, p.width, 3, padding=1),
        nn.BatchNorm2d(p.width),
        nn.ReLU(),
        nn.Conv2d(p.width, 2 * p.width, 3, padding=1),
        nn.BatchNorm2d(2 * p.width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * p.width, 2 * p.width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(p.dropout),
        nn.Linear(2 * p.width, p.num_classes),
    )


def build_vit(p: ViTParams) -> nn.Module:
    from torchvision.models import VisionTransformer

    return VisionTransformer(
        image_size=p.image_size,
        patch_size=p.patch_size,
        num_layers=p.num_layers,
        num_heads=p.num_heads,
        hidden_dim=p.hidden_dim,
        mlp_dim=p.mlp_dim,
        num_classes=p.num_classes,
        dropout=p.dropout,
    )


class TextRNN(nn.Module):
    """Embedding -> (bi)LSTM/GRU/RNN -> linear over the final hidden states; padding index 0."""

    def __init__(self, p: TextRNNParams):
        super().__init__()
        cell = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[p.cell]
        self.embedding = nn.Embedding(p.vocab_size, p.embedding_dim, padding_idx=0)
        self.rnn = cell(
            p.embedding_dim,
            p.hidden_dim,
            num_layers=p.n_layers,
            bidirectional=p.bidirectional,
            dropout=p.dropout if p.n_layers > 1 else 0.0,
            batch_first=True,
        )
        self.dropout = nn.Dropout(p.dropout)
        self.head = nn.Linear(p.hidden_dim * (2 if p.bidirectional else 1), p.num_classes)
        self.bidirectional = p.bidirectional

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        lengths = (tokens != 0).sum(dim=1).clamp(min=1).cpu()
        packed = nn.utils.rnn.pack_padded_sequence(
            self.embedding(tokens), lengths, batch_first=True, enforce_sorted=False
        )
        _, hidden = self.rnn(packed)
        if isinstance(hidden, tuple):  # LSTM returns (h, c)
            hidden = hidden[0]
        last = torch.cat([hidden[-2], hidden[-1]], dim=1) if self.bidirectional else hidden[-1]
        return self.head(self.dropout(last))


def _check_none(cfg, fail) -> None:
    return None


def _check_vit(cfg, fail) -> None:
    p: ViTParams = cfg.model.params
    if p.image_size % p.patch_size:
        fail("model.patch_size", f"{p.patch_size} does not divide model.image_size {p.image_size}",
             "choose a patch size that divides the image size, e.g. 4 for 32")
    if p.hidden_dim % p.num_heads:
        fail("model.num_heads", f"{p.num_heads} does not divide model.hidden_dim {p.hidden_dim}",
             "choose num_heads that divides hidden_dim")


def _check_rnn(cfg, fail) -> None:
    p: TextRNNParams = cfg.model.params
    if p.cell not in ("lstm", "gru", "rnn"):
        fail("model.cell", f"'{p.cell}' is not a recurrent cell", "use lstm, gru or rnn")
    if not 0 <= p.dropout < 1:
        fail("model.dropout", f"{p.dropout} is outside [0, 1)", "use e.g. 0.5")


@dataclass(frozen=True)
class ModelSpec:
    params: type
    build: Callable[[object], nn.Module]
    check: Callable = _check_none


MODELS: dict[str, ModelSpec] = {
    "mlp": ModelSpec(MLPParams, build_mlp),
    "small_cnn": ModelSpec(SmallCNNParams, build_small_cnn),
    "vit": ModelSpec(ViTParams, build_vit, _check_vit),
    "text_rnn": ModelSpec(TextRNNParams, TextRNN, _check_rnn),
}


def build_model(model_section) -> nn.Module:
    return MODELS[model_section.name].build(model_section.params)
