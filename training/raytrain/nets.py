"""The torch modules behind the built-in model components (raytrain.models holds their checked signatures)."""

from __future__ import annotations

import torch
from torch import nn


def mlp(in_features: int, hidden: int, out_features: int, layers: int) -> nn.Module:
    stack: list[nn.Module] = []
    width = in_features
    for _ in range(layers):
        stack += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    stack.append(nn.Linear(width, out_features))
    return nn.Sequential(*stack)


def small_cnn(in_channels: int, num_classes: int, width: int, dropout: float) -> nn.Module:
    # Global average pooling makes the same network fit 8x8 digits, 28x28 MNIST and 32x32 CIFAR.
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1),
        nn.BatchNorm2d(2 * width),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(2 * width, 2 * width, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Dropout(dropout),
        nn.Linear(2 * width, num_classes),
    )


class TextRNN(nn.Module):
    """Embedding -> (bi)LSTM/GRU/RNN -> linear over the final hidden states; padding index 0."""

    def __init__(self, vocab_size: int, embedding_dim: int, hidden_dim: int, n_layers: int, bidirectional: bool,
                 dropout: float, num_classes: int, cell: str):
        super().__init__()
        cell_class = {"lstm": nn.LSTM, "gru": nn.GRU, "rnn": nn.RNN}[cell]
        self.embedding = nn.Embedding(vocab_size, embedding_dim, padding_idx=0)
        self.rnn = cell_class(
            embedding_dim,
            hidden_dim,
            num_layers=n_layers,
            bidirectional=bidirectional,
            dropout=dropout if n_layers > 1 else 0.0,
            batch_first=True,
        )
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(hidden_dim * (2 if bidirectional else 1), num_classes)
        self.bidirectional = bidirectional

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
