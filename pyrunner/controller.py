"""controller.py — the PCIe share controller (DESIGN §4, seed 000, issue 5 point 6).

`pcie_frac` is the share of a window's deduplicated *missing* expert groups that the scheduler
copies over the link and runs on the device (where the source is pinned and staging has room);
the rest run on the CPU ExpertPool where their weights are. The controller picks it so that both
paths finish together, from rates it measures during decode:

    start     the value libstrata computed at load (its one owner: native/src/moe/offload.c,
              0.55 × probe_GBps / 20 clamped to [0, 1], or --pcie-frac), read from
              Model.offload_stats()["pcie_frac"]; clamped to [lo, hi] here
    measure   cpu_rate  = bytes of the missing groups the ExpertPool computed
                          / the pool's busy time for them
              pcie_rate = bytes copied / copy time; the probe's GB/s until copies are observed
    update    pcie_frac = clamp(pcie_rate / (pcie_rate + cpu_weight × cpu_rate))  cpu_weight 1.85
    schedule  the first update once ≥ first_windows (48) windows and ≥ min_groups (256) missing
              groups were observed; each later one no sooner than every_windows (96) windows
              after the previous one, again with ≥ min_groups groups since; at most
              max_updates (3) updates. Each update logs `pcie_frac 0.60 (was 0.49)`.

The rates of an update come from the windows since the previous update, i.e. measured under the
split they set: repeated updates are the iteration f ← rule(rates at f), which settles on the
rule's fixed point. A span whose CPU pool computed nothing (everything hit or went over the link)
has no CPU rate, so the update waits. clamp() is to [lo, hi] = [0, 1].

`--pcie-frac X` (ControllerSettings.fixed) pins pcie_frac to X for the whole run: no updates.
Every constant of the update is a field of ControllerSettings; the start formula's are libstrata's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerSettings:
    fixed: float | None = None    # --pcie-frac / STRATA_PCIE_FRAC: no controller at all
    cpu_weight: float = 1.85      # weight of the CPU rate in the update rule (fitted on a few machines)
    first_windows: int = 48       # windows before the first update
    min_groups: int = 256         # missing groups an update's measurement must span
    every_windows: int = 96       # windows between updates
    max_updates: int = 3
    lo: float = 0.0               # clamp of every value
    hi: float = 1.0

    def __post_init__(self):
        def bad(what):
            raise ValueError(f"pcie_frac controller: {what}")
        if not (0.0 <= self.lo <= self.hi <= 1.0):
            bad(f"lo {self.lo} and hi {self.hi} must satisfy 0 <= lo <= hi <= 1")
        if self.fixed is not None and not (isinstance(self.fixed, (int, float)) and 0.0 <= self.fixed <= 1.0):
            bad(f"--pcie-frac {self.fixed}: give a share between 0 and 1")
        if not (self.cpu_weight > 0 and math.isfinite(self.cpu_weight)):
            bad(f"cpu_weight {self.cpu_weight} must be a finite number > 0")
        for name in ("first_windows", "min_groups", "every_windows", "max_updates"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 0:
                bad(f"{name} {v!r} must be an integer >= 0")


class Controller:
    """The controller of one engine run, starting from `pcie_frac`, the share libstrata set at load
    (it is not recomputed here), with `probe_gbps` the link probe's rate (the link's rate until copies
    are measured). Call observe_window once per decode window with that window's counters; it returns
    the new pcie_frac when it changed it, else None."""

    def __init__(self, pcie_frac: float, probe_gbps: float, settings: ControllerSettings | None = None):
        s = settings or ControllerSettings()
        if not (isinstance(probe_gbps, (int, float)) and math.isfinite(probe_gbps) and probe_gbps >= 0):
            raise ValueError(f"pcie_frac controller: link probe {probe_gbps!r} GB/s must be a finite number >= 0")
        if not (isinstance(pcie_frac, (int, float)) and 0.0 <= pcie_frac <= 1.0):
            raise ValueError(f"pcie_frac controller: start share {pcie_frac!r} must be a number in [0, 1]")
        self.settings = s
        self.probe_gbps = float(probe_gbps)
        self.log: list[str] = []
        self.windows = 0          # windows observed
        self.updates = 0
        self.cpu_gbps: float | None = None    # the rates of the last update
        self.pcie_gbps: float | None = None
        self._copy_gbps: float | None = None  # last measured copy throughput
        self._last_update_window = 0
        self._reset_span()
        if s.fixed is not None:
            self.pcie_frac = float(s.fixed)
            self.log.append(f"pcie_frac {self.pcie_frac:.2f} (fixed by --pcie-frac)")
        else:
            self.pcie_frac = self._clamp(float(pcie_frac))
            self.log.append(f"pcie_frac {self.pcie_frac:.2f} (start: libstrata's, link probe "
                            f"{self.probe_gbps:.1f} GB/s)")

    @property
    def fixed(self) -> bool:
        return self.settings.fixed is not None

    def _clamp(self, x: float) -> float:
        return min(self.settings.hi, max(self.settings.lo, x))

    def _reset_span(self):
        self._cpu_bytes = 0.0
        self._cpu_s = 0.0
        self._pcie_bytes = 0.0
        self._pcie_s = 0.0
        self._groups = 0

    def observe_window(self, cpu_bytes: float, cpu_busy_s: float, pcie_bytes: float, pcie_s: float,
                       missing_groups: int) -> float | None:
        """One decode window: bytes of the missing groups the ExpertPool computed and its busy
        seconds for them; bytes copied over the link and the copies' seconds; the number of
        deduplicated missing groups (CPU + PCIe). Returns the new pcie_frac, or None."""
        vals = {"cpu_bytes": cpu_bytes, "cpu_busy_s": cpu_busy_s, "pcie_bytes": pcie_bytes, "pcie_s": pcie_s,
                "missing_groups": missing_groups}
        for k, v in vals.items():
            if not (isinstance(v, (int, float)) and math.isfinite(v) and v >= 0):
                raise ValueError(f"pcie_frac controller: {k} {v!r} must be a finite number >= 0")
        s = self.settings
        self.windows += 1
        self._cpu_bytes += cpu_bytes
        self._cpu_s += cpu_busy_s
        self._pcie_bytes += pcie_bytes
        self._pcie_s += pcie_s
        self._groups += int(missing_groups)
        if self.fixed or self.updates >= s.max_updates:
            return None
        if self.updates == 0:
            if self.windows < s.first_windows:
                return None
        elif self.windows - self._last_update_window < s.every_windows:
            return None
        if self._groups < s.min_groups or self._cpu_bytes <= 0 or self._cpu_s <= 0:
            return None
        cpu = self._cpu_bytes / self._cpu_s / 1e9
        if self._pcie_bytes > 0 and self._pcie_s > 0:   # else the last span's copies, else the probe
            self._copy_gbps = self._pcie_bytes / self._pcie_s / 1e9
        pcie = self._copy_gbps if self._copy_gbps is not None else self.probe_gbps
        old = self.pcie_frac
        new = self._clamp(pcie / (pcie + s.cpu_weight * cpu)) if pcie > 0 else self._clamp(0.0)
        self.pcie_frac = new
        self.cpu_gbps, self.pcie_gbps = cpu, pcie
        self.updates += 1
        self._last_update_window = self.windows
        self._reset_span()
        self.log.append(f"pcie_frac {new:.2f} (was {old:.2f})")
        return new
