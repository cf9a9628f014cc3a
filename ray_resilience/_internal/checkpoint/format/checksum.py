"""Data checksums: CRC-32C in hardware when the `crc32c` package is there, else zlib's CRC-32;
a file names the one it was written with, and readers verify with the same.

`combine` joins the checksums of two adjacent pieces without reading them again, so a writer that
checks each item of a file and the whole file passes over every large buffer once."""

from __future__ import annotations

import zlib
from functools import lru_cache
from typing import Any

try:
    import crc32c as _crc32c
except ImportError:  # pragma: no cover - a declared dependency; zlib keeps every reader working
    _crc32c = None

CHECKSUM = "crc32c" if _crc32c is not None else "crc32"
"""What new files carry."""


def known_checksum(name: Any) -> bool:
    return name == "crc32" or (name == "crc32c" and _crc32c is not None)


def checksum(name: str, data: Any, value: int = 0) -> int:
    """The running checksum `name` of `data` continued from `value` (both implementations
    release the GIL for large buffers)."""
    if name == "crc32c":
        return _crc32c.crc32c(data, value)
    return zlib.crc32(data, value)


_REVERSED_POLYNOMIAL = {"crc32": 0xEDB88320, "crc32c": 0x82F63B78}
"""Each CRC's generator polynomial, bit-reversed (both are reflected CRCs)."""

_X0 = 1 << 31
"""The polynomial 1 in the reflected representation (x^k is bit 31 - k)."""


def _multiply(a: int, b: int, polynomial: int) -> int:
    """a * b modulo the CRC's polynomial, both in the reflected representation."""
    product = 0
    bit = _X0
    while a:
        if a & bit:
            product ^= b
            a ^= bit
        bit >>= 1
        b = (b >> 1) ^ polynomial if b & 1 else b >> 1
    return product


@lru_cache(maxsize=128)
def _x_to_the_2_to_the(k: int, polynomial: int) -> int:
    """x^(2^k) modulo the polynomial (cached: every shift by n bytes takes ~log2(n) of them;
    k stays below 64 for any length, so both polynomials' powers fit)."""
    if k == 0:
        return _X0 >> 1
    half = _x_to_the_2_to_the(k - 1, polynomial)
    return _multiply(half, half, polynomial)


def combine(name: str, first: int, second: int, second_length: int) -> int:
    """The checksum `name` of A followed by B from A's (`first`) and B's (`second`, of
    `second_length` bytes): A's checksum carried through B's length in zero bits (a product by
    x^(8 * length)), xor B's. It holds for both CRCs here because each starts from and ends with
    the same all-ones register, which cancels out."""
    polynomial = _REVERSED_POLYNOMIAL[name]
    shift, k, n = _X0, 3, second_length
    while n:
        if n & 1:
            shift = _multiply(_x_to_the_2_to_the(k, polynomial), shift, polynomial)
        n >>= 1
        k += 1
    return _multiply(shift, first, polynomial) ^ second
