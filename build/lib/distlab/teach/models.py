"""The source article's models and data, importable so workers and tests can share them.

Chapters define these in cells exactly as the article does (that is the point of distlab); this
module holds the same definitions for code that is not a notebook (tests, benchmarks, scripts).
"""
import torch
import torch.nn as nn
from torch.utils.data import Dataset


class ToyModel(nn.Module):
    """The article's basic DDP example model: 10 -> 10 -> ReLU -> 5."""

    def __init__(self):
        super().__init__()
        self.net1 = nn.Linear(10, 10)
        self.relu = nn.ReLU()
        self.net2 = nn.Linear(10, 5)

    def forward(self, x):
        return self.net2(self.relu(self.net1(x)))


class SimpleModel(nn.Module):
    """The article's two-GPU training model: 10 -> 100 -> 50 -> 2 with ReLUs."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(10, 100), nn.ReLU(), nn.Linear(100, 50), nn.ReLU(), nn.Linear(50, 2))

    def forward(self, x):
        return self.net(x)


class DummyDataset(Dataset):
    """The article's random classification data; ``seed`` makes every rank build the same data."""

    def __init__(self, size=10000, seed=None):
        g = torch.Generator().manual_seed(seed) if seed is not None else None
        self.data = torch.randn(size, 10, generator=g)
        self.targets = torch.randint(0, 2, (size,), generator=g)

    def __len__(self):
        return len(self.data)

    def __getitem__(self, idx):
        return self.data[idx], self.targets[idx]
