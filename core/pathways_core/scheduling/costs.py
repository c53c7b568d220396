"""What work costs under proportional share: the device time its function (or its program)
takes on the island, as measured.

An item of work is charged when it is taken (the policy's pass advances then), before it ran,
so it is charged what its function's runs took: the mean device time (devices x time, as the
island's executors report it) of its runs, the last ``RECENT`` or so, not its own. Every
tenant running one function then pays alike for it, so shares of a function's runs follow the
weights, however a shared host's load makes single runs vary; and a function taking ten times
longer than another costs ten times more, so shares of device time follow the weights across
functions too.

A price that moves while tenants take turns favours the light ones: after a cheap turn a
tenant of weight 1 comes back soon, after a dear one late, so it takes more of the cheap turns
(with the median of nine runs, which swung between the 10 µs and 70 µs an executor reports
for one small function, weight 1 of 1:2:4:8 got 8% of the island, not 6.7%). So a function's
price is the median of its first ``SETTLED`` runs, then follows the mean of its runs by steps
(``STEADY``), looked at after twice as many runs each time (at most every ``RECENT``): it is
set a few times, then stays while the function's runs do (stepping at every run past a
quarter, the lightest of 1:2:4:8 got 7% in one run in ten).

The first run of a function is not counted (it compiles, and reads its inputs from the host:
charged its 150 ms, a tenant waited out the whole run), a run past ``OUTLIER`` times the mean
counts as that much, and one reported with no times (refused before it ran) not at all. Work
of a function without a price yet costs its devices times the island's typical time per
device (of the prices set so far; next to nothing before any was).
"""

from __future__ import annotations

import statistics
from collections import OrderedDict
from dataclasses import dataclass, field

MIN_NS_PER_DEVICE = 1_000
"""The least a device's part of any work costs: work is never free (free items, such as
deletions, go by other rules), however short the times reported. Also what work costs before
anything was measured: charged a guess (a millisecond), the first few computations of a
tenant whose computations took 50 µs cost it as much as forty, and it waited while the others
ran that many; charged little, they cost each tenant alike, and little."""

RECENT = 128
"""Runs of a function its mean is of: the mean of every run counted, up to this many, then a
moving average that gives each new run 1/RECENT of the weight."""

OUTLIER = 10
"""A run counts as at most this many times its function's mean (once it has ``SETTLED``
runs): one held up by the host's load for 30 ms moves a 70 µs function's price by 3 µs."""

SETTLED = 8
"""Runs of a function counted before it has a price of its own (the median of them; until
then, the island's typical time per device); then each run moves the mean (by 1/n, past
``RECENT`` runs by 1/RECENT)."""

STEADY = 0.25
"""A function's price follows its mean only once the mean moved this far from it (a quarter):
a price that moves with every run, even by the noise of single runs, favours the light
tenants (see above); one that moves by steps follows the real changes."""

SMOOTHING = 0.1
"""The weight of a new price in the island's typical time per device."""

MAX_MEASURED = 16_384
"""Functions and programs whose runs are kept (the least recently measured go first)."""


@dataclass
class _Runs:
    first: list[float] = field(default_factory=list)  # the first SETTLED runs counted
    counted: int = 0
    mean: float | None = None  # None until a run past the first is counted
    price: float | None = None  # None until SETTLED runs are counted
    review: int = SETTLED  # the count of runs at which the price is looked at next

    def add(self, device_ns: float) -> bool:
        """Count a run; whether the price changed."""
        if self.counted < SETTLED:
            # The median of the first few: the second run, often still slow (1.6 ms of a
            # 0.1 ms function), weighed as much as the next nine together in a mean.
            self.first.append(device_ns)
            self.mean = statistics.median(self.first)
            if len(self.first) == SETTLED:
                self.first = []
        else:
            assert self.mean is not None
            device_ns = min(device_ns, OUTLIER * self.mean)
            self.mean += (device_ns - self.mean) / min(self.counted + 1, RECENT)
        self.counted += 1
        if self.counted < self.review:
            return False
        # Looked at after SETTLED runs, then twice as many, ... (every RECENT at most): the
        # noise of a mean of more runs moves it less, so the price of a steady function
        # settles after a few looks, and a function whose runs changed is followed.
        self.review = min(2 * self.counted, self.counted + RECENT)
        if self.price is not None and abs(self.mean - self.price) <= STEADY * self.price:
            return False
        self.price = self.mean
        return True


class DeviceTimeCosts:
    """Measured device time of work, by function or program id."""

    def __init__(self, limit: int = MAX_MEASURED) -> None:
        self._runs: OrderedDict[str, _Runs] = OrderedDict()
        self._ns_per_device: float | None = None  # the island's, over all work measured
        self._limit = limit

    def cost(self, key: str, devices: int) -> float:
        """The device-nanoseconds to charge for work of ``key`` on ``devices`` devices."""
        runs = self._runs.get(key)
        price = runs.price if runs is not None else None
        if price is None:
            price = devices * (self._ns_per_device or MIN_NS_PER_DEVICE)
        return max(price, devices * MIN_NS_PER_DEVICE)

    def measured(self, key: str, devices: int, device_ns: int) -> None:
        """Work of ``key`` on ``devices`` devices took ``device_ns`` in all (0: not timed)."""
        if device_ns <= 0 or devices <= 0:
            return
        runs = self._runs.pop(key, None)
        if runs is None:  # its first run: kept as seen, not counted
            runs = _Runs()
        elif runs.add(device_ns) and runs.price is not None:
            # The island's typical time per device follows the prices set, not single runs.
            per_device = runs.price / devices
            typical = self._ns_per_device
            self._ns_per_device = (
                per_device if typical is None else typical + SMOOTHING * (per_device - typical)
            )
        self._runs[key] = runs
        if len(self._runs) > self._limit:
            self._runs.popitem(last=False)

    def forget(self, key: str) -> None:
        """Drop ``key``'s runs (its function or program is forgotten)."""
        self._runs.pop(key, None)
