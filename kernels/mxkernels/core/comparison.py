"""How an implementation's output is compared with its oracle's: bit for bit, or by an SQNR floor.

``BitExact`` and ``MinSQNR`` are the rules a ``stages.StageSpec`` declares (``Rule``); each ``compare`` returns None
or the first ``Mismatch`` (which output, where, what each side holds there), which ``mxbench check`` prints.
"""

from __future__ import annotations

import math

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Mismatch:
    """The first disagreement with the oracle: which output, where, and what each side holds there."""

    output: str
    message: str
    index: tuple[int, ...] | None = None
    expected: str | None = None
    got: str | None = None

    def describe(self, input_text: str | None = None) -> str:
        """One line: output, message, index, the input there (``input_text``, where the caller knows it), expected,
        got."""
        text = f"{self.output}: {self.message}"
        if self.index is not None:
            text += f"; first at index {self.index}"
        if input_text:
            text += f": input {input_text}"
        if self.expected is not None:
            text += f", expected {self.expected}, got {self.got}"
        return text


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(_BITS[t.element_size()])


def _value(t: torch.Tensor, index: tuple[int, ...]) -> str:
    v = t[index]
    if t.dtype in (torch.float8_e4m3fn, torch.float8_e8m0fnu, torch.uint8):
        byte = int(v.view(torch.uint8)) if t.dtype != torch.uint8 else int(v)
        return f"{v.float().item()!r} (byte 0x{byte:02x})"
    return repr(v.item())


def _unravel(flat: int, shape: Sequence[int]) -> tuple[int, ...]:
    index = []
    for dim in reversed(shape):
        index.append(flat % dim)
        flat //= dim
    return tuple(reversed(index))


def _check_like(name: str, got: object, expected: torch.Tensor) -> Mismatch | None:
    if not isinstance(got, torch.Tensor):
        return Mismatch(name, f"not a tensor: {type(got).__name__}")
    if got.dtype != expected.dtype:
        return Mismatch(name, f"dtype {got.dtype} where the oracle gives {expected.dtype}")
    if tuple(got.shape) != tuple(expected.shape):
        return Mismatch(name, f"shape {tuple(got.shape)} where the oracle gives {tuple(expected.shape)}")
    return None


@dataclass(frozen=True)
class BitExact:
    """Every compared element equal bit for bit (NaN payloads and signed zeros included); layout may differ.
    ``any_nan``: a NaN matches any NaN (an arithmetic result's NaN payload is the hardware's, not the contract's)."""

    any_nan: bool = False

    def compare(self, name: str, got: object, expected: torch.Tensor) -> Mismatch | None:
        wrong = _check_like(name, got, expected)
        if wrong is not None:
            return wrong
        differ = _bits(got) != _bits(expected).to(got.device)
        if self.any_nan and got.is_floating_point():
            differ &= ~(torch.isnan(got) & torch.isnan(expected.to(got.device)))
        differ = differ.reshape(-1)
        if not bool(differ.any()):
            return None
        flat = int(differ.nonzero()[0])
        index = _unravel(flat, got.shape)
        count = int(differ.sum())
        return Mismatch(name, f"{count} of {differ.numel()} elements differ", index, _value(expected, index),
                        _value(got.to(expected.device), index))  # fmt: skip

    def describe(self) -> str:
        return "bit-exact"


def sqnr_db(got: torch.Tensor, expected: torch.Tensor) -> float:
    """Signal-to-quantization-noise ratio of ``got`` against ``expected`` in dB (inf when equal), over the elements
    where ``expected`` is finite."""
    ref = expected.double()
    finite = torch.isfinite(ref)
    ref, out = ref[finite], got.double()[finite]
    noise = float((out - ref).pow(2).sum())
    signal = float(ref.pow(2).sum())
    if noise == 0.0:
        return float("inf")
    return 10.0 * torch.log10(torch.tensor(signal / noise)).item() if signal else float("-inf")


def _value_class(x: torch.Tensor) -> torch.Tensor:
    """0 NaN, 1 +Inf, 2 -Inf, 3 finite."""
    return torch.where(torch.isnan(x), 0, torch.where(x == float("inf"), 1, torch.where(x == float("-inf"), 2, 3)))


@dataclass(frozen=True)
class MinSQNR:
    """Non-finite elements where the oracle has them (the same NaN / +-Inf pattern), and an SQNR over the finite
    ones of at least ``floor_db``. ``per_slice``: the floor holds for every slice along the first dim on its own
    (each expert of a weight gradient), and a slice the oracle gives as all zeros (an empty expert) must be all
    zeros: one SQNR over the whole output would let a small expert's garbage hide under a large one's signal.
    ``row_floor_db``: besides the floor over the whole, every row (the last dim's vectors: a token's output) at least
    this: where a few rows hold nearly all the energy (a planted block's tokens), one SQNR over the whole passes any
    error in the others."""

    floor_db: float
    per_slice: bool = False
    row_floor_db: float | None = None

    def compare(self, name: str, got: object, expected: torch.Tensor) -> Mismatch | None:
        wrong = _check_like(name, got, expected)
        if wrong is not None:
            return wrong
        g, e = got.detach().double().cpu(), expected.detach().double().cpu()
        same_class = _value_class(g) == _value_class(e)
        if not bool(same_class.all()):
            index = _unravel(int((~same_class).reshape(-1).nonzero()[0]), g.shape)
            return Mismatch(name, "NaN / Inf where the oracle has none, or the reverse", index, repr(e[index].item()),
                            repr(g[index].item()))  # fmt: skip
        slices = [(i, g[i], e[i]) for i in range(g.shape[0])] if self.per_slice and g.dim() > 1 else [(None, g, e)]
        for i, gs, es in slices:
            wrong = self._compare_slice(name, gs, es)
            if wrong is not None:
                prefix = () if i is None else (i,)
                where = "" if i is None else f" in slice {i}"
                index = None if wrong.index is None else prefix + wrong.index
                return Mismatch(name, wrong.message + where, index, wrong.expected, wrong.got)
        return None

    def _compare_slice(self, name: str, g: torch.Tensor, e: torch.Tensor) -> Mismatch | None:
        finite = torch.isfinite(e)
        if self.per_slice and not bool(e[finite].ne(0).any()):
            nonzero = (g.nan_to_num(0.0) != 0) & finite
            if bool(nonzero.any()):
                index = _unravel(int(nonzero.reshape(-1).nonzero()[0]), g.shape)
                return Mismatch(name, "nonzero where the oracle is all zero (an empty group?)", index,
                                repr(e[index].item()), repr(g[index].item()))  # fmt: skip
            return None
        db = sqnr_db(g, e)
        if db < self.floor_db:
            err = (g - e).abs().nan_to_num(0.0)
            index = _unravel(int(err.reshape(-1).argmax()), g.shape)
            return Mismatch(name, f"SQNR {db:.1f} dB < {self.floor_db:g} dB (largest error at index)", index,
                            repr(e[index].item()), repr(g[index].item()))  # fmt: skip
        return None if self.row_floor_db is None else self._compare_rows(name, g, e)

    def _compare_rows(self, name: str, g: torch.Tensor, e: torch.Tensor) -> Mismatch | None:
        finite = torch.isfinite(e)
        ge, ee = g.where(finite, 0.0).reshape(-1, g.shape[-1]), e.where(finite, 0.0).reshape(-1, e.shape[-1])
        noise, signal = (ge - ee).square().sum(-1), ee.square().sum(-1)
        # a row the oracle gives as zeros must be zeros; else 10 log10(signal / noise) >= the row floor
        bad = (noise > signal * 10 ** (-self.row_floor_db / 10)) & (noise > 0)
        if not bool(bad.any()):
            return None
        row = int(bad.nonzero()[0])
        db = 10 * math.log10(float(signal[row]) / float(noise[row])) if float(signal[row]) > 0 else -math.inf
        col = int((ge[row] - ee[row]).abs().argmax())
        index = _unravel(row * g.shape[-1] + col, g.shape)
        return Mismatch(name, f"SQNR {db:.1f} dB < {self.row_floor_db:g} dB in one row (largest error at index)",
                        index, repr(e[index].item()), repr(g[index].item()))  # fmt: skip

    def describe(self) -> str:
        rows = "" if self.row_floor_db is None else f", every row >= {self.row_floor_db:g} dB"
        return f"SQNR >= {self.floor_db:g} dB" + (" per expert" if self.per_slice else "") + rows


Rule = BitExact | MinSQNR
