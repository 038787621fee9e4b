"""The torch modules behind the built-in model components that are more than a stack of layers (raytrain.models
holds every component's checked signature, and builds the plain stacks itself), and the GPT preset's loss.

May import: nothing
"""

from __future__ import annotations

import torch
from torch import nn


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


class TransformerBlock(nn.Module):
    """Pre-LayerNorm decoder block: x + attention(norm(x)), then x + mlp(norm(x)). A class of its own because FSDP
    shards each block as one unit."""

    def __init__(self, d_model: int, n_heads: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.dropout = dropout
        self.attention_norm = nn.LayerNorm(d_model)
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.projection = nn.Linear(d_model, d_model)
        self.residual_dropout = nn.Dropout(dropout)
        self.mlp_norm = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(), nn.Linear(4 * d_model, d_model),
                                 nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, width = x.shape
        heads = (t.view(batch, length, self.n_heads, width // self.n_heads).transpose(1, 2)
                 for t in self.qkv(self.attention_norm(x)).split(width, dim=2))
        attended = nn.functional.scaled_dot_product_attention(
            *heads, dropout_p=self.dropout if self.training else 0.0, is_causal=True)
        x = x + self.residual_dropout(self.projection(attended.transpose(1, 2).reshape(batch, length, width)))
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    """A decoder-only language model: token + learned position embeddings, `n_layers` TransformerBlocks, a final
    LayerNorm and a head; tokens [B, T] -> next-token logits [B, T, vocab_size]. The head is not tied to the token
    embedding: a parameter shared across FSDP units cannot be sharded with each."""

    def __init__(self, vocab_size: int, block_size: int, n_layers: int, n_heads: int, d_model: int, dropout: float):
        super().__init__()
        self.block_size = block_size
        self.token_embedding = nn.Embedding(vocab_size, d_model)
        self.position_embedding = nn.Embedding(block_size, d_model)
        self.dropout = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(TransformerBlock(d_model, n_heads, dropout) for _ in range(n_layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)
        self.apply(_init_gpt_weights)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        length = tokens.shape[1]
        if length > self.block_size:
            raise ValueError(f"a sequence of {length} tokens is longer than the model's block_size {self.block_size}; "
                             f"set model.block_size to at least {length} (or feed shorter sequences: data.block_size)")
        positions = torch.arange(length, device=tokens.device)
        x = self.dropout(self.token_embedding(tokens) + self.position_embedding(positions))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def _init_gpt_weights(module: nn.Module) -> None:
    # GPT-2's initialisation: torch's defaults (uniform, fan-in scaled; N(0, 1) embeddings) start the loss far above
    # ln(vocab_size) and train slower.
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


def next_token_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross entropy of logits [B, T, V] against the next tokens [B, T], averaged over every token (F.cross_entropy
    wants the classes in dim 1, a language model gives them last)."""
    return nn.functional.cross_entropy(logits.flatten(0, -2), targets.flatten())
