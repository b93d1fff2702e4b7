"""The host-state rule (sdbench.ops.launch_floor): a path's wall floor is the probe of the host's state."""

import pytest

from sdbench.ops.launch_floor import (
    HOST_STATE_TOLERANCE,
    config_host_slowed,
    host_slowed,
    host_state_differs,
    lowest_wall_floors,
)


def _row(floor_us, path="custom_op", view="wall", impl="ballot"):
    return {"impl": impl, "view": view, "launch_floor_us": floor_us, "launch_path": path, "status": "ok"}


@pytest.mark.parametrize(("floor_us", "other_us", "differs"), [
    (17.4, 18.9, False),  # the spread of one state in a quick sweep on the H200 (9%)
    (29.9, 17.4, True),  # the slow state: 1.72x
    (17.4, 29.9, True),  # symmetric: which of the two is the slow one does not matter
    (20.0, 22.9, False),  # 14.5%: inside the 15% tolerance
    (20.0, 23.1, True),  # 15.5%
    (20.0, 0.0, False),  # no floor measured: nothing to say
])
def test_two_floors_of_a_path_differ_beyond_the_tolerance(floor_us, other_us, differs):
    assert HOST_STATE_TOLERANCE == 0.15
    assert host_state_differs(floor_us, other_us) is differs


def test_the_tolerance_is_a_parameter():
    assert host_state_differs(20.0, 23.0, tolerance=0.1) and not host_state_differs(20.0, 29.0, tolerance=0.5)


def test_the_lowest_wall_floor_is_taken_per_launch_path():
    rows = [_row(29.9), _row(17.6), _row(52.6, "triton"), _row(30.0, "triton"), _row(None, "triton"),
            _row(1.0, view="graph"), _row(0.9, view="gpu"), _row(19.0, path=None)]  # null path: the custom op's
    assert lowest_wall_floors(rows) == {"custom_op": 17.6, "triton": 30.0}


def test_a_rows_host_slowed_is_its_own_floor_over_its_paths_lowest():
    lowest = {"custom_op": 17.6, "triton": 30.0}
    assert host_slowed(_row(29.92), lowest) == pytest.approx(1.7)
    assert host_slowed(_row(45.0, "triton"), lowest) == pytest.approx(1.5)
    assert host_slowed(_row(1.7, view="graph"), lowest) is None  # the rule reads the wall view alone
    assert host_slowed(_row(None), lowest) is None
    assert host_slowed(_row(20.0, "torch_eager"), lowest) is None  # a path the sweep never measured


def test_a_config_is_as_slow_as_its_slowest_path():
    lowest = {"custom_op": 17.6, "triton": 30.0}
    rows = [_row(18.0), _row(36.0, "triton"), _row(40.0, view="gpu")]
    assert config_host_slowed(rows, lowest) == pytest.approx(1.2)
    assert config_host_slowed([_row(40.0, view="gpu")], lowest) is None
