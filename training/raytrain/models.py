"""The built-in model components: ordinary `_component_` targets, exactly like a user's own.

    model: {_component_: raytrain.models.mlp, hidden: 32}    # or the short alias: _component_: mlp

Each is a function whose annotated keyword arguments are the config's `model` keys (checked before Ray starts,
constraints included) and which returns a plain torch.nn.Module; Ray Train wraps it later (prepare_model). torch
is imported only when a model is built, so that `raytrain validate` checks these signatures without it.

May import: nets
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import Field

if TYPE_CHECKING:
    from torch import nn

Positive = Annotated[int, Field(gt=0)]
Dropout = Annotated[float, Field(ge=0, lt=1)]


def mlp(in_features: Positive = 1, hidden: Positive = 32, out_features: Positive = 1,
        layers: Annotated[int, Field(ge=0)] = 1) -> "nn.Module":
    """A multilayer perceptron: `layers` hidden layers of `hidden` units with ReLU."""
    from torch import nn

    stack: list[nn.Module] = []
    width = in_features
    for _ in range(layers):
        stack += [nn.Linear(width, hidden), nn.ReLU()]
        width = hidden
    stack.append(nn.Linear(width, out_features))
    return nn.Sequential(*stack)


def small_cnn(in_channels: Positive = 1, num_classes: Annotated[int, Field(ge=2)] = 10, width: Positive = 32,
              dropout: Dropout = 0.1) -> "nn.Module":
    """Three convolutions and global average pooling; `width` channels first, twice as many after."""
    from torch import nn

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


def vit(image_size: Positive = 32, patch_size: Positive = 4, num_layers: Positive = 12, num_heads: Positive = 8,
        hidden_dim: Positive = 384, mlp_dim: Positive = 768, num_classes: Annotated[int, Field(ge=2)] = 10,
        dropout: Dropout = 0.0) -> "nn.Module":
    """torchvision's VisionTransformer."""
    if image_size % patch_size:
        raise ValueError(f"patch_size {patch_size} does not divide image_size {image_size}; choose a patch size "
                         f"that divides the image size, e.g. 4 for 32")
    if hidden_dim % num_heads:
        raise ValueError(f"num_heads {num_heads} does not divide hidden_dim {hidden_dim}")
    from torchvision.models import VisionTransformer

    return VisionTransformer(image_size=image_size, patch_size=patch_size, num_layers=num_layers,
                             num_heads=num_heads, hidden_dim=hidden_dim, mlp_dim=mlp_dim, num_classes=num_classes,
                             dropout=dropout)


def text_rnn(vocab_size: Annotated[int, Field(ge=3)] = 20000, embedding_dim: Positive = 100,
             hidden_dim: Positive = 256, n_layers: Positive = 2, bidirectional: bool = True, dropout: Dropout = 0.5,
             num_classes: Annotated[int, Field(ge=2)] = 4,
             cell: Literal["lstm", "gru", "rnn"] = "lstm") -> "nn.Module":
    """Embedding -> (bi)LSTM/GRU/RNN -> linear; vocab_size must cover the data's vocabulary (data.vocab_size)."""
    from raytrain import nets

    return nets.TextRNN(vocab_size, embedding_dim, hidden_dim, n_layers, bidirectional, dropout, num_classes, cell)


def gpt(vocab_size: Annotated[int, Field(ge=2)] = 256, block_size: Positive = 128, n_layers: Positive = 6,
        n_heads: Positive = 6, d_model: Positive = 384, dropout: Dropout = 0.0) -> "nn.Module":
    """A decoder-only transformer language model (pre-LayerNorm); block_size is the longest sequence it takes."""
    if d_model % n_heads:
        raise ValueError(f"n_heads {n_heads} does not divide d_model {d_model}; choose n_heads that divides d_model "
                         f"(e.g. 6 for 384) or a d_model that is a multiple of n_heads")
    from raytrain import nets

    return nets.GPT(vocab_size, block_size, n_layers, n_heads, d_model, dropout)
