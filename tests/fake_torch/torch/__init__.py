"""A CPU stand-in for the few torch calls of helpers/act/p2p_selftest.py, to test
the corruption path without GPUs.  FAKE_TORCH_CORRUPT="0>1,2>3" flips one word
in every copy from device 0 to 1 (and 2 to 3); FAKE_TORCH_FAIL="1>0" raises."""

from __future__ import annotations

import os
import random
from array import array

int32 = "i"


def _pairs(var: str) -> set[tuple[int, int]]:
    out = set()
    for item in filter(None, os.environ.get(var, "").split(",")):
        a, b = item.split(">")
        out.add((int(a), int(b)))
    return out


class _Scalar:
    def __init__(self, v: int) -> None:
        self.v = v

    def item(self) -> int:
        return self.v


class Tensor:
    def __init__(self, data: array, device: str = "cpu") -> None:
        self.data = data
        self.device = device

    def _index(self) -> int:
        return int(self.device.split(":")[1]) if self.device.startswith("cuda") else -1

    def to(self, device: str) -> "Tensor":
        data = array("i", self.data)
        src, dst = self._index(), int(device.split(":")[1])
        if (src, dst) in _pairs("FAKE_TORCH_FAIL"):
            raise RuntimeError(f"CUDA error: an illegal memory access ({src}->{dst})")
        if (src, dst) in _pairs("FAKE_TORCH_CORRUPT"):
            data[len(data) // 2] ^= 0x5A5A
        return Tensor(data, device)

    def cpu(self) -> "Tensor":
        return Tensor(array("i", self.data), "cpu")

    def __ne__(self, other: object) -> "Tensor":  # type: ignore[override]
        assert isinstance(other, Tensor)
        return Tensor(array("i", (int(a != b) for a, b in zip(self.data, other.data))))

    def sum(self) -> _Scalar:
        return _Scalar(sum(self.data))


class Generator:
    def manual_seed(self, seed: int) -> "Generator":
        self.rng = random.Random(seed)
        return self


def randint(low: int, high: int, size: tuple[int], dtype: str, generator: Generator) -> Tensor:
    return Tensor(array("i", (generator.rng.randrange(low, high) for _ in range(size[0]))))


class cuda:  # noqa: N801  (torch.cuda is a module there)
    @staticmethod
    def device_count() -> int:
        visible = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        return len([v for v in visible.split(",") if v])

    @staticmethod
    def can_device_access_peer(a: int, b: int) -> bool:
        return True   # what the driver says under a broken IOMMU, too

    @staticmethod
    def synchronize(device: int) -> None:
        pass
