"""The local proxy backend deletes an array a worker thread waits for or reads only once that
use ends (deleting it meanwhile crashed jaxlib)."""

from __future__ import annotations

from pathways_client.proxy.local import _InUse


class Value:
    def __init__(self) -> None:
        self.deleted = 0

    def delete(self) -> None:
        self.deleted += 1


def test_a_deletion_waits_for_the_last_use_in_progress() -> None:
    in_use = _InUse()
    held, other = Value(), Value()
    in_use.hold([held, held])  # one list naming it twice: two uses
    in_use.hold([held])
    in_use.delete(held)
    in_use.delete(other)  # not in use: at once
    assert (held.deleted, other.deleted) == (0, 1)
    in_use.release([held, held])
    assert held.deleted == 0
    in_use.release([held])
    assert held.deleted == 1
    # Used again after its end: nothing left behind to delete twice.
    in_use.hold([held])
    in_use.release([held])
    assert held.deleted == 1


def test_a_value_whose_deletion_fails_is_taken_as_deleted() -> None:
    class Donated:
        def delete(self) -> None:
            raise RuntimeError("Array has been deleted")  # JAX freed it as donated

    in_use = _InUse()
    donated = Donated()
    in_use.hold([donated])
    in_use.delete(donated)
    in_use.release([donated])  # no exception
