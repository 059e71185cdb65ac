"""The run's secret randomness: every draw the accountant treats as secret comes from here, nowhere else.

Poisson sampling, the Gaussian noise, JL directions, D2P2's projections, sparse's selection (and GRAPE's
projections), private tuning's number of trials and noisy scores all derive from one root, never from the run's
public `seed` (initialisation, dropout, data split), which results.json, the Hydra config and W&B publish. The root
is `privacy.seed`, or, when that is null (the default), 128 bits drawn from the operating system at run start and
kept only in checkpoints, so that nothing a run writes lets anyone regenerate its noise or its batches, and a
resumed run continues the streams.

Each use draws from its own key (root, stream, indices...), so streams never overlap:
- by default 128 bits from numpy's SeedSequence of the key: on the host they key a numpy Philox (torch's CPU generator
  keeps only 32 bits of its seed: its noise could be found by trying every seed, 2^32 of them in about a day on one
  core, from a single released gradient); on CUDA they seed torch's Philox and set its counter's offset (124 bits).
  Fast; its security rests on the root staying secret;
- with `privacy.secure_rng=true`, the output of SHAKE-256 keyed by the key (a cryptographic XOF, i.e. a CSPRNG
  stream): uniforms from 53 random bits, normals by Box-Muller in float64. Slower; as reproducible as the root.
"""

from __future__ import annotations

import hashlib
import math
import os
import secrets
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dpbench.core.errors import ConfigurationError

STREAMS = {"sampling": 1, "shuffle": 2, "noise": 3, "jl": 4, "d2p2": 5, "selection": 6, "grape": 7,
           "verify": 8, "tuning": 9, "sharded_noise": 10}
"""Stream identifiers mixed into every key: no two uses of the root share a stream."""


class PrivacyRandomness:
    """The root of a run's secret randomness (see the module docstring)."""

    def __init__(self, seed: int | None = None, secure: bool = False):
        if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or seed < 0):
            raise ConfigurationError(f"privacy.seed must be a non-negative integer or null, got {seed!r}")
        self.explicit = seed is not None
        self.root = seed if seed is not None else secrets.randbits(128)
        self.secure = secure

    def key(self, stream: str, *indices: int) -> tuple[int, ...]:
        return (self.root, STREAMS[stream], *(int(i) for i in indices))

    def draws(self, stream: str, *indices: int, device: torch.device | str = "cpu") -> KeyedDraws:
        """Fresh draws from one key: the same key always gives the same draws (use each key once)."""
        return KeyedDraws(self, self.key(stream, *indices), torch.device(device))

    def numpy_generator(self, stream: str, *indices: int) -> np.random.Generator:
        """A numpy Generator for one key; under secure_rng a Philox keyed by 128 bits of the SHAKE-256 stream."""
        if self.secure:
            key = int.from_bytes(_shake(_key_bytes(self.key(stream, *indices)), 0, 16), "little")
            return np.random.Generator(np.random.Philox(key=key))
        return np.random.default_rng(np.random.SeedSequence(list(self.key(stream, *indices))))

    def state_dict(self) -> dict[str, Any]:
        """Secret: it goes into checkpoints only."""
        return {"root": self.root, "secure": self.secure, "explicit": self.explicit}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.explicit and state["root"] != self.root:
            raise ConfigurationError(
                "privacy.seed differs from the one the checkpoint was trained with: resume with the same "
                "privacy.seed (or leave it null to continue the checkpoint's own stream)"
            )
        if state["secure"] != self.secure:
            raise ConfigurationError(
                f"privacy.secure_rng={self.secure} differs from the checkpoint's ({state['secure']}): resume with the "
                "setting the run was trained with"
            )
        self.root, self.explicit = state["root"], state["explicit"]


def _key_bytes(key: tuple[int, ...]) -> bytes:
    return b"".join(value.to_bytes(32, "little") for value in key)


def _shake(key: bytes, counter: int, size: int) -> bytes:
    return hashlib.shake_256(key + counter.to_bytes(8, "little")).digest(size)


def _uniform_from_bytes(data: bytes) -> Tensor:
    """Uniform (0, 1) doubles from 53 bits each (never 0 or 1, so log() is safe)."""
    bits = torch.frombuffer(bytearray(data), dtype=torch.int64) & ((1 << 53) - 1)
    return (bits.to(torch.float64) + 0.5) / float(1 << 53)


def _box_muller(u1: Tensor, u2: Tensor, count: int) -> Tensor:
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = 2.0 * math.pi * u2
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)])[:count]


PARALLEL_DRAWS = 1 << 20
"""Normals per block of a host draw, each block its own counter, so that the draws do not depend on the core count; the
blocks are spread over the cores (numpy's Philox runs without the GIL): 22.7M float32 normals took 160 ms on two
cores, 313 on one, against torch.randn's 140 on one (2026-11-28)."""


class KeyedDraws:
    """Consecutive draws from one key on one device: a Philox keyed by 128 bits of the key (numpy's on the host, a
    fresh counter block per call and per thread; torch's on CUDA), or SHAKE-256 blocks (secure_rng)."""

    def __init__(self, randomness: PrivacyRandomness, key: tuple[int, ...], device: torch.device):
        self.device = device
        self.secure = randomness.secure
        self.counter = 0
        self.generator: torch.Generator | None = None
        if self.secure:
            self._key = _key_bytes(key)
            return
        high, low = (int(word) for word in np.random.SeedSequence(list(key)).generate_state(2, dtype=np.uint64))
        if device.type == "cuda":
            self.generator = torch.Generator(device=device).manual_seed(high)
            self.generator.set_offset(4 * (low >> 4))  # Philox's offset counts in fours
        else:
            self._philox_key = high << 64 | low

    def _secure_uniform(self, count: int) -> Tensor:
        self.counter += 1
        return _uniform_from_bytes(_shake(self._key, self.counter, 8 * count))

    def _host(self, part: int = 0) -> np.random.Generator:
        """The current call's generator for one part of its draw: counters never shared by two calls or parts."""
        return np.random.Generator(np.random.Philox(key=self._philox_key, counter=[0, 0, part, self.counter]))

    def _host_normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype) -> Tensor:
        self.counter += 1
        out = torch.empty(shape, dtype=torch.float64 if dtype == torch.float64 else torch.float32)
        flat = out.view(-1).numpy()
        blocks = max(1, -(-flat.size // PARALLEL_DRAWS))  # fixed blocks: the same draws on any number of cores

        def fill(block: int) -> None:
            self._host(block).standard_normal(out=flat[block * PARALLEL_DRAWS: (block + 1) * PARALLEL_DRAWS],
                                              dtype=flat.dtype)

        threads = min(os.cpu_count() or 1, blocks)
        if threads == 1:
            for block in range(blocks):
                fill(block)
        else:
            with ThreadPoolExecutor(threads) as pool:  # per call: no threads outlive it into a fork
                list(pool.map(fill, range(blocks)))
        return out.to(device=self.device, dtype=dtype)

    def uniform(self, count: int) -> Tensor:
        """(count,) uniforms on [0, 1) (float32; float64 under secure_rng)."""
        if self.secure:
            return self._secure_uniform(count).to(self.device)
        if self.generator is None:
            self.counter += 1
            return torch.from_numpy(self._host().random(count, dtype=np.float32)).to(self.device)
        return torch.rand(count, generator=self.generator, device=self.device)

    def normal(self, shape: torch.Size | tuple[int, ...], dtype: torch.dtype = torch.float32) -> Tensor:
        """Standard normals of `shape` and `dtype` on the device."""
        if self.secure:
            count = math.prod(shape)
            pairs = (count + 1) // 2
            uniforms = self._secure_uniform(2 * pairs)
            values = _box_muller(uniforms[:pairs], uniforms[pairs:], count)
            return values.view(shape).to(device=self.device, dtype=dtype)
        if self.generator is None:
            return self._host_normal(shape, dtype)
        return torch.randn(shape, generator=self.generator, device=self.device, dtype=dtype)

    def permutation(self, n: int) -> Tensor:
        if self.secure:
            return torch.argsort(self._secure_uniform(n))
        if self.generator is None:
            self.counter += 1
            return torch.from_numpy(self._host().permutation(n)).to(self.device)
        return torch.randperm(n, generator=self.generator, device=self.device)

    def state_dict(self) -> dict[str, Any]:
        if self.generator is None:
            return {"device": str(self.device), "counter": self.counter}
        return {"device": str(self.device), "generator": self.generator.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.generator is not None:
            self.generator.set_state(state["generator"])
        elif "counter" in state:
            self.counter = state["counter"]
        else:
            raise ConfigurationError(
                "this checkpoint's secret host randomness comes from dpbench before 2026-11-28, whose CPU generator "
                "kept 32 bits of its seed: continuing it would keep that weakness: start a new run")


class PrivateStream:
    """A long-lived secret stream (the noise, JL directions): every draw is fresh, across device moves and resumes.

    Moving to another device opens a new segment of the key rather than re-seeding, so nothing drawn before is ever
    drawn again; a checkpoint restores the position (onto the saved device when it exists, else a new segment).
    """

    def __init__(self, randomness: PrivacyRandomness, stream: str):
        self.randomness = randomness
        self.stream = stream
        self.segment = 0
        self._draws: KeyedDraws | None = None

    def on(self, device: torch.device | str) -> KeyedDraws:
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        if self._draws is None or self._draws.device != device:
            if self._draws is not None:
                self.segment += 1
            self._draws = self.randomness.draws(self.stream, self.segment, device=device)
        return self._draws

    def normal_like(self, reference: Tensor, std: float = 1.0) -> Tensor:
        """N(0, std^2) of the reference's shape, dtype and device (a fresh buffer)."""
        return self.on(reference.device).normal(reference.shape, reference.dtype).mul_(std)

    def state_dict(self) -> dict[str, Any]:
        return {"segment": self.segment, "draws": None if self._draws is None else self._draws.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.segment, self._draws = state["segment"], None
        saved = state["draws"]
        if saved is None:
            return
        device = torch.device(saved["device"])
        if device.type == "cuda" and not (torch.cuda.is_available() and device.index < torch.cuda.device_count()):
            self.segment += 1  # the saved device is gone: continue on a new segment, never replay
            return
        self._draws = self.randomness.draws(self.stream, self.segment, device=device)
        self._draws.load_state_dict(saved)
