"""Typed keys for a GPU's error counters: ECC by (scope, kind, memory location) and NVLink errors
by counter. Each enum's values are NVML's own indices (nvml.h; tests/test_xid.py checks), so
a key is also where the shared state puts the count; its stored spelling is its name in lower
case (`volatile.corrected.dram`, `replay`), what the state directory has always held."""
from __future__ import annotations

import re
from enum import IntEnum
from typing import NamedTuple, TypeVar
from mokkafs.model import state_limits

_E = TypeVar("_E", bound="_Spelled")


class _Spelled(IntEnum):
    # IntEnum: a key hashes as an int, so the publisher's per-tick reads stay cheap.

    @property
    def spelling(self) -> str:
        return self.name.lower()

    @classmethod
    def from_spelling(cls: type[_E], word: str) -> _E:
        """ValueError unless `word` is a member's `spelling`."""
        if not (isinstance(word, str) and word.islower() and word.upper() in cls.__members__):
            raise ValueError(word)
        return cls[word.upper()]


class EccScope(_Spelled):
    """nvmlEccCounterType_t: volatile clears at a reset, aggregate lives in the InfoROM."""

    VOLATILE = 0
    AGGREGATE = 1


class EccKind(_Spelled):
    """nvmlMemoryErrorType_t. A command says `sbe` or `dbe` (`short`)."""

    CORRECTED = 0
    UNCORRECTED = 1

    @property
    def short(self) -> str:
        return "sbe" if self is EccKind.CORRECTED else "dbe"

    @classmethod
    def from_short(cls, word: str) -> "EccKind":
        return cls.CORRECTED if word == "sbe" else cls.UNCORRECTED


class MemoryLocation(_Spelled):
    """nvmlMemoryLocation_t; the spellings are the locations `inject_ecc` takes."""

    L1 = 0
    L2 = 1
    DRAM = 2
    REGISTER = 3
    TEXTURE = 4
    TEXTURE_SHM = 5
    CBU = 6
    SRAM = 7


class EccCounter(NamedTuple):
    scope: EccScope
    kind: EccKind
    location: MemoryLocation

    @property
    def key(self) -> str:
        """The state directory's spelling: `volatile.corrected.dram`."""
        return f"{self.scope.spelling}.{self.kind.spelling}.{self.location.spelling}"

    @classmethod
    def from_key(cls, key: str) -> "EccCounter":
        """ValueError unless `key` is what `key` writes."""
        parts = key.split(".") if isinstance(key, str) else []
        if len(parts) != 3:
            raise ValueError(key)
        return cls(EccScope.from_spelling(parts[0]), EccKind.from_spelling(parts[1]),
                   MemoryLocation.from_spelling(parts[2]))


# Every ECC counter by (scope, kind) row, each row in location order: the shared state's layout.
ECC_ROWS: tuple[tuple[EccScope, EccKind, tuple[EccCounter, ...]], ...] = tuple(
    (s, k, tuple(EccCounter(s, k, loc) for loc in MemoryLocation)) for s in EccScope for k in EccKind
)
ECC_COUNTERS: tuple[EccCounter, ...] = tuple(c for _, _, row in ECC_ROWS for c in row)
_ROW = {(s, k): row for s, k, row in ECC_ROWS}


def zero_ecc() -> dict[EccCounter, int]:
    return dict.fromkeys(ECC_COUNTERS, 0)


def ecc_row(ecc: dict[EccCounter, int], scope: EccScope, kind: EccKind) -> list[int]:
    """The counts of one (scope, kind), by location."""
    return [ecc[c] for c in _ROW[scope, kind]]


def ecc_total(ecc: dict[EccCounter, int], scope: EccScope, kind: EccKind) -> int:
    return sum(map(ecc.__getitem__, _ROW[scope, kind]))  # at C speed: /metrics sums 4 per GPU


class NvLinkCounter(_Spelled):
    """nvmlNvLinkErrorCounter_t (NVML_NVLINK_ERROR_DL_*)."""

    REPLAY = 0
    RECOVERY = 1
    CRC_FLIT = 2
    CRC_DATA = 3


NVLINK_COUNTERS: tuple[NvLinkCounter, ...] = tuple(NvLinkCounter)
MAX_NVLINKS = state_limits.MAX_NVLINKS  # NVML_NVLINK_MAX_LINKS, what the shared state holds


def zero_nvlink() -> dict[NvLinkCounter, int]:
    return dict.fromkeys(NVLINK_COUNTERS, 0)


def link_from_key(key: str) -> int:
    """A link index as the state directory spells it (`"3"`); ValueError otherwise."""
    if not (isinstance(key, str) and re.fullmatch(r"0|[1-9][0-9]?", key) and int(key) < MAX_NVLINKS):
        raise ValueError(key)
    return int(key)
