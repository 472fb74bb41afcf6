"""Random trees in best-first layout (parents[i] < i) for the kernel tests."""

from __future__ import annotations

import os

import torch

# TRITON_INTERPRET=0 on a CUDA machine runs the same tests on the GPU.
DEVICE = torch.device(
    "cuda" if os.environ.get("TRITON_INTERPRET") == "0" and torch.cuda.is_available() else "cpu"
)


def make_parents(shape: str, n: int, gen: torch.Generator) -> list[int]:
    """parents of an n-node tree: chain, star, bushy (few levels, many children), deep, random."""
    parents = [-1]
    for i in range(1, n):
        if shape == "chain":
            parents.append(i - 1)
        elif shape == "star":
            parents.append(0)
        elif shape == "bushy":
            parents.append(int(torch.randint(0, max(1, min(i, 1 + i // 8)), (1,), generator=gen)))
        elif shape == "deep":
            parents.append(max(0, i - 1 - int(torch.randint(0, 3, (1,), generator=gen))))
        else:
            parents.append(int(torch.randint(0, i, (1,), generator=gen)))
    return parents


def depths_of(parents: list[int]) -> list[int]:
    depth = [0] * len(parents)
    for i in range(1, len(parents)):
        depth[i] = depth[parents[i]] + 1
    return depth


def make_tree(
    shape: str, n: int, vocab: int, gen: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """tokens, parents, depth (int64); siblings get distinct tokens (vocab must exceed the fan-out)."""
    parents = make_parents(shape, n, gen)
    used: dict[int, set[int]] = {}
    tokens = [int(torch.randint(0, vocab, (1,), generator=gen))]
    for i in range(1, n):
        taken = used.setdefault(parents[i], set())
        free = [t for t in range(vocab) if t not in taken]
        tok = free[int(torch.randint(0, len(free), (1,), generator=gen))]
        taken.add(tok)
        tokens.append(tok)
    return (
        torch.tensor(tokens, device=DEVICE),
        torch.tensor(parents, device=DEVICE),
        torch.tensor(depths_of(parents), device=DEVICE),
    )
