"""Ways of forgetting accumulated usage: LTRF's rounds and discount, and a half-life (Slurm's
``PriorityDecayHalfLife``, Kueue's ``usageHalfLifeTime``): ``half_life`` for ``ltrf`` and
``hltrf``, worked examples with the arithmetic in comments."""

from __future__ import annotations

import math

import pytest

from fairstream.core.model import ModelError, TaskCompleted

from builders import engine, node, submit, tree

H = 100.0
LN2 = math.log(2.0)


def used_alone(half_life: float | str, seconds: float = 100.0):
    """One node of 1 GB; A runs one 1 GB task from t = 0 for ``seconds``, then nothing runs.
    The quantum is 0 and fixed, so accumulated usage is the integral alone."""
    e = engine(tree("A"), "ltrf", half_life=half_life, quantum=0, quantum_mode="fixed")
    e.step(0.0, [node("n1", mem=1), submit("a1", "A", mem=1)])
    e.step(seconds, [TaskCompleted(seconds, "a1")])
    return e


@pytest.mark.parametrize("at, expected", [
    # While it runs: int_0^100 2^(-(100 - s)/100) ds = 100/ln 2 x (1 - 1/2) = 72.13 GB-s.
    pytest.param(100.0, H / LN2 * 0.5, id="after 100 s of use with a half-life of 100 s: 72.13 GB-s"),
    # Idle from then: halved every 100 s.
    pytest.param(200.0, H / LN2 * 0.25, id="100 s later: half of it"),
    pytest.param(400.0, H / LN2 * 0.5 / 8, id="300 s later: an eighth"),
])
def test_usage_decays_by_half_every_half_life(at, expected):
    e = used_alone(H)
    assert e.accounting.accumulated_rows([0], at)[0, 0] == pytest.approx(expected)


def test_without_a_half_life_usage_is_kept_whole():
    e = used_alone("inf")
    assert e.accounting.accumulated_rows([0], 400.0)[0, 0] == pytest.approx(100.0)


def test_the_integral_over_many_steps_equals_the_one_over_a_single_step():
    # Decay is integrated exactly between events: cutting the same 100 s into ten steps
    # changes nothing (2^(-a/h) 2^(-b/h) = 2^(-(a+b)/h)).
    one = used_alone(H)
    many = engine(tree("A"), "ltrf", half_life=H, quantum=0, quantum_mode="fixed")
    many.step(0.0, [node("n1", mem=1), submit("a1", "A", mem=1)])
    for t in range(10, 100, 10):
        many.step(float(t), [])
    many.step(100.0, [TaskCompleted(100.0, "a1")])
    assert many.accounting.accumulated_rows([0], 250.0)[0, 0] == pytest.approx(
        one.accounting.accumulated_rows([0], 250.0)[0, 0])


@pytest.mark.parametrize("half_life, first", [
    # A used the whole 1 GB for 1,000 s long ago (t = 0-1,000), B for 100 s just now
    # (t = 1,900-2,000). Without decay: A 1,000 GB-s against B's 100: B is served first.
    pytest.param("inf", "B", id="without decay the tenant that used more long ago waits"),
    # Half-life 100 s, at t = 2,000: A's 100/ln 2 (1 - 2^-10) x 2^-10 = 0.14 GB-s, B's
    # 100/ln 2 (1 - 2^-1) = 72.1 GB-s: A is served first.
    pytest.param(H, "A", id="with a half-life of 100 s old usage is forgotten"),
])
def test_a_half_life_lets_old_usage_be_forgotten_by_ltrf(half_life, first):
    e = engine(tree("A", "B"), "ltrf", half_life=half_life, quantum=0, quantum_mode="fixed")
    e.step(0.0, [node("n1", mem=1), submit("a1", "A", mem=1)])
    e.step(1000.0, [TaskCompleted(1000.0, "a1")])
    e.step(1900.0, [submit("b1", "B", mem=1)])
    e.step(2000.0, [TaskCompleted(2000.0, "b1")])
    decisions = e.step(2000.5, [submit("a2", "A", mem=1), submit("b2", "B", mem=1)]).decisions
    assert [d.tenant for d in decisions] == [first]


def test_a_half_life_must_be_positive():
    with pytest.raises(ModelError, match="half_life=0: must be > 0"):
        engine(tree("A"), "ltrf", half_life=0)


@pytest.mark.slow
def test_compare_forgetting_orders_the_ways_of_forgetting_between_fair_and_f_ltmm(tmp_path, capsys):
    import json

    from fairstream.cli import main

    assert main(["compare-forgetting", "--out", str(tmp_path)]) == 0
    part = json.loads(capsys.readouterr().out)["a_part"]
    # Until contention ends at 900 s the cluster serves 900 x 100 GB-s. fair: B all of it
    # before A arrives at 300 s and half after: A's part (900 - 300) / 2 / 900 = 1/3. F-LTMM:
    # A all of it from 300 s until their totals are level (600 s), then half: 1/2.
    assert part["fair (memoryless)"] == pytest.approx(1 / 3, abs=0.01)
    assert part["ltrf, F-LTMM (remembers all)"] == pytest.approx(0.5, abs=0.01)
    # Forgetting pays A back less: a round ending at 400 s most, a long half-life least;
    # discount counts both tenants' usage beyond their share alike, so changes nothing here.
    assert (part["fair (memoryless)"] < part["ltrf, round=400"] < part["ltrf, half_life=300"]
            < part["ltrf, half_life=1200"] < part["ltrf, F-LTMM (remembers all)"])
    assert part["ltrf, discount=0.5"] == pytest.approx(part["ltrf, F-LTMM (remembers all)"])
    assert (tmp_path / "forgetting.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
