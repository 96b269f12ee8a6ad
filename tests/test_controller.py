"""The PCIe share controller (pyrunner/controller.py): the start value and its clamping, the update
schedule (48 windows and 256 groups, then every 96, at most 3) on a simulated device with known rates,
the probe until copies are measured, convergence to the rule's fixed point when the rates depend on
the split, --pcie-frac, and every constant as a setting. The start value is libstrata's (issue 16: the
formula has one owner, native/src/moe/offload.c); the controller takes it as given."""
from __future__ import annotations

import math
import re

import pytest

from pyrunner.controller import Controller, ControllerSettings

GB = 1e9
PROBE = 17.9                   # the seed's link probe, GB/s
START = 0.55 * PROBE / 20      # the share libstrata starts from for it (offload.c; tests/test_offload.py checks it)


def seeded(settings=None):
    """A controller as generate() makes it on the seed's machine: libstrata's start share and the probe."""
    return Controller(START, PROBE, settings)


class SimDevice:
    """A device whose CPU pool and link run at known rates (GB/s, constants or functions of the
    split): a window's missing groups are split by pcie_frac, and the counters follow."""

    def __init__(self, cpu_gbps, pcie_gbps, groups=8, group_bytes=3e6, pinned=True):
        self.cpu = cpu_gbps if callable(cpu_gbps) else (lambda f, v=cpu_gbps: v)
        self.pcie = pcie_gbps if callable(pcie_gbps) else (lambda f, v=pcie_gbps: v)
        self.groups, self.group_bytes, self.pinned = groups, group_bytes, pinned

    def window(self, frac):
        share = frac if self.pinned else 0.0
        total = self.groups * self.group_bytes
        cpu_b, pcie_b = (1 - share) * total, share * total
        return (cpu_b, cpu_b / (self.cpu(frac) * GB), pcie_b, pcie_b / (self.pcie(frac) * GB) if pcie_b else 0.0,
                self.groups)


def run(ctrl, dev, n_windows):
    """[(window number, new value)] of every update in n_windows windows."""
    updates = []
    for w in range(1, n_windows + 1):
        v = ctrl.observe_window(*dev.window(ctrl.pcie_frac))
        if v is not None:
            assert v == ctrl.pcie_frac
            updates.append((w, v))
    return updates


def rule(pcie, cpu, weight=1.85):
    return pcie / (pcie + weight * cpu)


def test_start_value_is_libstratas_and_clamping():
    c = seeded()
    assert c.pcie_frac == START
    assert c.log == ["pcie_frac 0.49 (start: libstrata's, link probe 17.9 GB/s)"]
    # the start is taken as given, never recomputed from the probe (one owner of the formula)
    assert Controller(0.3, 17.9).pcie_frac == 0.3
    assert Controller(1.0, 50.0).pcie_frac == 1.0 and Controller(0.0, 0.0).pcie_frac == 0.0
    assert Controller(0.9, 40.0, ControllerSettings(hi=0.8)).pcie_frac == 0.8   # the controller's own range
    assert Controller(0.03, 1.0, ControllerSettings(lo=0.2)).pcie_frac == 0.2
    with pytest.raises(ValueError, match="probe"):
        Controller(0.5, -1.0)
    with pytest.raises(ValueError, match="probe"):
        Controller(0.5, float("nan"))
    for bad in (-0.1, 1.5, float("nan"), None):
        with pytest.raises(ValueError, match="start share"):
            Controller(bad, 17.9)


def test_schedule_48_96_3_with_known_rates():
    c = seeded()
    ups = run(c, SimDevice(cpu_gbps=5.9, pcie_gbps=12.0), 1000)
    want = rule(12.0, 5.9)
    assert [w for w, _ in ups] == [48, 144, 240]
    assert all(v == pytest.approx(want) for _, v in ups)
    assert c.updates == 3 and c.windows == 1000
    assert c.cpu_gbps == pytest.approx(5.9) and c.pcie_gbps == pytest.approx(12.0)
    assert c.log[1] == f"pcie_frac {want:.2f} (was 0.49)" == "pcie_frac 0.52 (was 0.49)"
    assert all(re.fullmatch(r"pcie_frac \d\.\d\d \(was \d\.\d\d\)", line) for line in c.log[1:])
    assert len(c.log) == 4


def test_the_seed_run():
    # Seed 000: probe 17.9 GB/s -> 0.49; CPU pool ~5.9 GB/s; copies measured at ~16.4 GB/s -> 0.60.
    c = seeded()
    ups = run(c, SimDevice(cpu_gbps=5.9, pcie_gbps=16.4), 48)
    assert len(ups) == 1 and c.log[-1] == "pcie_frac 0.60 (was 0.49)"


def test_enough_groups_before_each_update():
    # 2 missing groups a window: 256 are reached at window 128, then 128 windows after each update.
    c = seeded()
    ups = run(c, SimDevice(5.9, 12.0, groups=2), 1000)
    assert [w for w, _ in ups] == [128, 256, 384]
    # With plenty of groups the window counts rule: 48 and 96.
    c = seeded()
    assert [w for w, _ in run(c, SimDevice(5.9, 12.0, groups=40), 400)] == [48, 144, 240]


def test_probe_until_copies_are_observed():
    c = seeded()
    dev = SimDevice(cpu_gbps=5.9, pcie_gbps=8.0, pinned=False)   # nothing can be copied yet
    ups = run(c, dev, 48)
    assert ups == [(48, pytest.approx(rule(17.9, 5.9)))] and c.pcie_gbps == 17.9
    dev.pinned = True                                            # copies now run at 8 GB/s
    ups = run(c, dev, 96)
    assert ups == [(96, pytest.approx(rule(8.0, 5.9)))] and c.pcie_gbps == pytest.approx(8.0)
    dev.pinned = False                                           # no copies: the last measured rate
    ups = run(c, dev, 96)
    assert ups == [(96, pytest.approx(rule(8.0, 5.9)))]


def test_no_cpu_work_no_update():
    c = seeded()
    for _ in range(500):   # every missing group went over the link: no CPU rate to compare with
        assert c.observe_window(0, 0.0, 3e6, 3e6 / (12 * GB), 8) is None
    assert c.updates == 0 and c.pcie_frac == pytest.approx(0.49225) and len(c.log) == 1


def test_converges_to_the_rules_fixed_point():
    # Rates that depend on the split: the pool slows as it gets fewer groups to overlap, the link
    # as more copies contend. The fixed point f* = rule(pcie(f*), cpu(f*)), by bisection:
    cpu = lambda f: 6.0 * (0.4 + 0.6 * (1 - f))      # noqa: E731
    pcie = lambda f: 14.0 * (1 - 0.4 * f)             # noqa: E731
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if rule(pcie(mid), cpu(mid)) > mid else (lo, mid)
    fstar = (lo + hi) / 2
    c = seeded(ControllerSettings(max_updates=10))
    f0 = c.pcie_frac
    ups = run(c, SimDevice(cpu, pcie), 48 + 96 * 9)
    assert len(ups) == 10
    errs = [abs(f0 - fstar)] + [abs(v - fstar) for _, v in ups]
    assert all(b <= a + 1e-12 for a, b in zip(errs, errs[1:])), errs
    assert errs[-1] < 1e-6 < errs[0]
    # Each update applies the rule to the rates measured under the previous split.
    f = f0
    for _, v in ups:
        assert v == pytest.approx(rule(pcie(f), cpu(f)))
        f = v
    # The default three updates already get within 1e-3.
    c = seeded()
    run(c, SimDevice(cpu, pcie), 1000)
    assert c.updates == 3 and abs(c.pcie_frac - fstar) < 1e-3


def test_update_is_clamped():
    c = seeded(ControllerSettings(hi=0.5, lo=0.1))
    run(c, SimDevice(cpu_gbps=0.5, pcie_gbps=30.0), 48)            # rule: 0.97
    assert c.pcie_frac == 0.5 and c.log[-1] == "pcie_frac 0.50 (was 0.49)"
    c = seeded(ControllerSettings(lo=0.1))
    run(c, SimDevice(cpu_gbps=500.0, pcie_gbps=1.0), 48)           # rule: 0.001
    assert c.pcie_frac == 0.1


def test_fixed_by_pcie_frac():
    c = seeded(ControllerSettings(fixed=0.3))
    assert c.fixed and c.pcie_frac == 0.3
    assert run(c, SimDevice(5.9, 12.0), 1000) == []
    assert c.pcie_frac == 0.3 and c.log == ["pcie_frac 0.30 (fixed by --pcie-frac)"]
    assert seeded(ControllerSettings(fixed=0)).pcie_frac == 0.0
    with pytest.raises(ValueError, match="--pcie-frac 1.5"):
        ControllerSettings(fixed=1.5)


def test_every_constant_is_a_setting():
    s = ControllerSettings(cpu_weight=1.0, first_windows=10, min_groups=0, every_windows=20, max_updates=5)
    c = Controller(0.6, 20.0, s)
    assert c.pcie_frac == pytest.approx(0.6)
    ups = run(c, SimDevice(cpu_gbps=4.0, pcie_gbps=12.0), 300)
    assert [w for w, _ in ups] == [10, 30, 50, 70, 90]
    assert all(v == pytest.approx(0.75) for _, v in ups)       # 12 / (12 + 1.0 x 4)
    assert Controller(0.6, 20.0, ControllerSettings(max_updates=0)).observe_window(1e6, 1e-3, 0, 0, 10 ** 6) is None


@pytest.mark.parametrize("kw", [dict(cpu_weight=0), dict(cpu_weight=math.inf), dict(first_windows=-1),
                                dict(lo=0.6, hi=0.5), dict(max_updates=1.5)])
def test_bad_settings(kw):
    with pytest.raises(ValueError, match="pcie_frac controller"):
        ControllerSettings(**kw)


def test_bad_observations():
    c = seeded()
    with pytest.raises(ValueError, match="cpu_busy_s"):
        c.observe_window(1e6, -1.0, 0, 0, 1)
    with pytest.raises(ValueError, match="pcie_bytes"):
        c.observe_window(1e6, 1.0, float("nan"), 0, 1)
    assert c.windows == 0


def test_generate_starts_from_libstratas_share_and_leaves_it_there(tmp_path, monkeypatch):
    """Issue 16: the start formula has one owner (libstrata). generate() makes the controller from the share
    libstrata computed at load and does not write a share of its own before the controller's first update."""
    from pyrunner.model import Model
    from pyrunner.models import make_model

    path = tmp_path / "tiny.gguf"
    make_model("tiny", str(path), "f32", 0)
    with Model(str(path), threads=2, n_ctx=256, device="sim", cache_gib=0.0, tail_skip=0, sim_link_gbps=8,
               split="seed") as m:
        start = m.offload_stats()["pcie_frac"]
        writes = []
        real = m.set_pcie_frac
        monkeypatch.setattr(m, "set_pcie_frac", lambda f: (writes.append(f), real(f))[1])
        c = m.generate("The offload engine", max_tokens=20, temperature=0)     # < 48 windows: no update
        ctl = m.controller
        assert ctl.updates == 0 and ctl.pcie_frac == start and writes == []
        assert c.stats["pcie_frac"] == start
        assert ctl.log == [f"pcie_frac {start:.2f} (start: libstrata's, link probe {ctl.probe_gbps:.1f} GB/s)"]
