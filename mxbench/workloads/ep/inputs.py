"""Seeded inputs of an EP run: each rank's routing (balanced or skewed) and its layer tensors.

Routing is drawn on the CPU from (seed, rank), so a run is the same on any device and any rank can be replayed:

* balanced: copy c = t * top_k + j of rank r goes to global expert (c + r * top_k) mod (W * E), then the tokens are
  shuffled. Consecutive ids are distinct, so each token's top_k experts are; when T * top_k is a multiple of W * E
  every expert gets exactly T * top_k / (W * E) copies from every rank.
* skewed: one router's preference over the W * E experts, Dirichlet(alpha) shares drawn from ``seed`` (the same
  on every rank, the sweeps' ``SKEW_ALPHA``); each token draws its top_k distinct experts from them without replacement
  (``torch.multinomial``, generator seeded by (seed, rank)). Popular experts' ranks receive more rows.

The tensors are drawn on the run's device from (seed, rank): x (T, K) ~ N(0, 1), w (E, N, K) ~ N(0, 1/K) (unit
scale outputs), dy (T * top_k, N) ~ N(0, 1e-4), in bf16.
"""

from __future__ import annotations

import torch

from ...plan.points import GROUP_KINDS
from ...plan.skew import SKEW_ALPHA, skewed_shares

ROUTING_METHOD = {
    "balanced": "copy c of rank r -> expert (c + r*top_k) mod (W*E), tokens shuffled (torch.randperm, "
    "(seed*1000003+rank) mod 2**63)",
    "skewed": f"expert shares dirichlet(alpha={SKEW_ALPHA}) from numpy.random.default_rng(seed); each token's top_k "
    "distinct experts by torch.multinomial without replacement (generator (seed*1000003+rank) mod 2**63)",
}


def _generator(seed: int, rank: int, device: torch.device | str = "cpu") -> torch.Generator:
    # modulo torch's seed range: any --seed below 2**63 gives a valid generator seed (the same one as before for
    # every seed whose product fitted)
    return torch.Generator(device=device).manual_seed((seed * 1_000_003 + rank) % 2**63)


def routing(T: int, top_k: int, num_experts: int, kind: str, seed: int, rank: int) -> torch.Tensor:
    """(T, top_k) int64 global expert ids of rank ``rank``'s tokens (module doc)."""
    gen = _generator(seed, rank)
    if kind == "balanced":
        copies = torch.arange(T * top_k).view(T, top_k)
        experts = (copies + rank * top_k) % num_experts
        return experts[torch.randperm(T, generator=gen)]
    if kind == "skewed":
        shares = torch.from_numpy(skewed_shares(num_experts, seed))  # the same preference on every rank
        return torch.multinomial(shares.expand(T, num_experts), top_k, replacement=False, generator=gen)
    raise ValueError(f"groups must be one of {', '.join(GROUP_KINDS)}; got {kind!r}")


def layer_tensors(T: int, K: int, N: int, E: int, top_k: int, seed: int, rank: int, device: torch.device):
    """x (T, K), w (E, N, K), dy (T * top_k, N), bf16 on ``device`` (module doc)."""
    gen = _generator(seed, rank, device)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(torch.bfloat16)

    return {"x": randn(T, K), "w": randn(E, N, K, scale=K**-0.5), "dy": randn(T * top_k, N, scale=1e-2)}


def ep_layer_tensors(T: int, K: int, N: int, E: int, world: int, seed: int, rank: int, device: torch.device,
                     shared_experts: int = 0):  # fmt: skip
    """The whole layer's tensors of one rank (``--layer``), bf16 on ``device``: x (T, K) ~ N(0, 1), the router's
    wr (W*E, K) ~ N(0, 1/K), the same on every rank (drawn from the seed alone: a replicated weight), this rank's
    experts w13 (E, 2N, K) ~ N(0, 1/K) and w2 (E, K, N) ~ N(0, 1/N), and dy (T, K) ~ N(0, 1e-4). With ``shared_experts``
    experts (hidden width Ns = N * shared), their replicated ws13 (1, 2Ns, K) ~ N(0, 1/K) and ws2 (1, K, Ns) ~
    N(0, 1/Ns), drawn after wr from the seed alone (the other tensors are those of a run without them)."""
    gen, shared = _generator(seed, rank, device), torch.Generator(device=device).manual_seed(seed * 1_000_003 - 1)

    def randn(*shape, scale=1.0, g=gen):
        return (torch.randn(*shape, generator=g, device=device) * scale).to(torch.bfloat16)

    out = {"x": randn(T, K), "wr": randn(world * E, K, scale=K**-0.5, g=shared),
           "w13": randn(E, 2 * N, K, scale=K**-0.5), "w2": randn(E, K, N, scale=N**-0.5), "dy": randn(T, K, scale=1e-2)}
    if shared_experts:
        Ns = N * shared_experts
        out.update(ws13=randn(1, 2 * Ns, K, scale=K**-0.5, g=shared), ws2=randn(1, K, Ns, scale=Ns**-0.5, g=shared))
    return out
