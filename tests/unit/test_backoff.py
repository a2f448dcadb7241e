"""The crash-loop back-off pre-start waits out on systemd < 254
(helpers/act/backoff.py): systemd's own rule (service_restart_usec_next),
and nothing waited on a start someone asked for."""

from __future__ import annotations

import logging

import pytest

from infer_units.generator.log import NOTICE
from infer_units.helpers.act.backoff import restart_delay, wait_out


def test_the_delays_grow_geometrically_to_the_ceiling() -> None:
    delays = [restart_delay(n, 5.0, 6, 300.0) for n in range(1, 10)]
    assert delays[0] == 5.0 and delays[6:] == [300.0, 300.0, 300.0]
    # RestartSec * (Max / RestartSec) ** ((n - 1) / steps): about twice as long each time
    assert delays[1] == pytest.approx(5 * 60 ** (1 / 6))
    assert all(1.9 < b / a < 2.1 for a, b in zip(delays, delays[1:7]))


@pytest.mark.parametrize("first, steps, ceiling", [(5.0, 0, 300.0), (5.0, 6, 5.0),
                                                   (0.0, 6, 300.0)])
def test_no_backoff_configured_is_restartsec(first: float, steps: int, ceiling: float) -> None:
    assert restart_delay(4, first, steps, ceiling) == first


def test_an_automatic_restart_waits_the_rest_and_says_why(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="infer_units")
    slept: list[float] = []
    waited = wait_out("m.service", 1.0, 2, 4.0, lambda unit: 2, slept.append)
    assert waited == pytest.approx(1.0) and slept == [pytest.approx(1.0)]
    [said] = caplog.records
    assert said.levelno == NOTICE
    assert said.getMessage().startswith("automatic restart 2 of m.service (crash loop): "
                                        "waiting 2.0s")
    assert "the next waits 4.0s, up to 4s" in said.getMessage()


def test_a_start_someone_asked_for_waits_nothing(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="infer_units")
    slept: list[float] = []
    assert wait_out("m.service", 1.0, 2, 4.0, lambda unit: 0, slept.append) == 0.0
    assert slept == [] and caplog.records == []


def test_systemd_that_cannot_answer_never_fails_the_start(
        caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="infer_units")

    def broken(unit: str) -> int:
        raise OSError("no bus")
    assert wait_out("m.service", 1.0, 2, 4.0, broken) == 0.0
    assert "not waiting" in caplog.records[0].getMessage()
