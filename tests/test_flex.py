"""FLEX (the FLEX paper): complementary degree (formulas 1-4), E and F (formulas 6-8), the model
file, and the meta-scheduler's choices."""

import json

import numpy as np
import pytest

from fairstream.flex import (DEFAULT_MODEL, FlexModel, Tree, complementary_degree, fairness_loss, load_model,
                             long_term_fairness_loss, makespan_reduction)
from fairstream.model import ModelError

CAPACITY = np.array([10.0, 10.0])


@pytest.mark.parametrize("jobs, degree", [
    # Figure 4, workload A: both jobs CPU-intensive: P(cpu) = 1, d = 0.
    pytest.param([[4, 1], [3, 2]], 0.0, id="two CPU-intensive jobs are not complementary"),
    # Workload B: one CPU-, one memory-intensive: P = (1/2, 1/2), d = -2 (1/2 log2 1/2) = 1.
    pytest.param([[4, 1], [1, 4]], 1.0, id="a CPU- and a memory-intensive job are fully complementary"),
    # Three to one: d = -(3/4 log2 3/4 + 1/4 log2 1/4) = 0.811.
    pytest.param([[4, 1], [3, 1], [2, 1], [1, 4]], 0.8113, id="three CPU-intensive jobs and one memory-intensive"),
    pytest.param([], 0.0, id="no jobs"),
])
def test_complementary_degree_is_the_entropy_of_dominant_resource_types(jobs, degree):
    assert complementary_degree(np.array(jobs, dtype=float).reshape(-1, 2), CAPACITY) == pytest.approx(degree, abs=1e-4)


def test_makespan_reduction_and_fairness_loss_against_drf():
    # Formula 6: T = 100 under DRF, 80 under the target: E = 0.2; slower is 0, not negative.
    assert makespan_reduction(100, 80) == pytest.approx(0.2) and makespan_reduction(100, 120) == 0.0
    # Formulas 7-8: A 10 -> 15 (slowdown 0.5), B 20 -> 10 (0): F = (0.5 + 0) / 2 = 0.25.
    assert fairness_loss({"A": 10, "B": 20}, {"A": 15, "B": 10}) == pytest.approx(0.25)
    # Section 5.2.4: long-term fairness degrees 1.0 -> 0.8 and 1.0 -> 1.2: loss (0.2 + 0) / 2.
    assert long_term_fairness_loss({"A": 1.0, "B": 1.0}, {"A": 0.8, "B": 1.2}) == pytest.approx(0.1)


def test_a_model_file_round_trips(tmp_path):
    tree = Tree([1, -1, -1], [2, -1, -1], [1, -2, -2], [0.15, -2.0, -2.0], [2, 2, 3])
    model = FlexModel(["fifo", "fair", "drf", "perf"], {"max_fairness_loss": tree, "min_makespan_reduction": tree})
    model.save(tmp_path / "m.json")
    again = load_model(tmp_path / "m.json")
    assert again.to_json() == model.to_json()
    # threshold <= 0.15 -> node 1 (drf); above -> node 2 (perf)
    assert [again.choose("max_fairness_loss", 0.5, t) for t in (0.1, 0.5)] == ["drf", "perf"]


@pytest.mark.parametrize("content, message", [
    pytest.param(None, "cannot read", id="a missing model file"),
    pytest.param("{not json", "not JSON", id="a file that is not JSON"),
    pytest.param('{"format": "other"}', "not a FLEX model file", id="a JSON file of another kind"),
    pytest.param('{"format": "fairstream-flex-model", "version": 99}', "model version 99", id="a model of another version"),
    pytest.param('{"format": "fairstream-flex-model", "version": 1, "classes": ["drf"], "trees": {"max_fairness_loss": '
                 '{"children_left": [-1], "children_right": [-1], "feature": [0], "threshold": [0], "leaf_class": [5]}}}',
                 "malformed model", id="a tree pointing at a class that is not there"),
])
def test_a_bad_model_file_is_one_line_naming_it(tmp_path, content, message):
    from tests.builders import engine, tree as tenants

    path = tmp_path / "model.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ModelError, match=message) as error:
        engine(tenants("A"), "flex", ("cpu", "mem"), model=str(path))
    assert "\n" not in str(error.value) and "model" in str(error.value)


def test_two_slas_at_once_are_refused():
    from tests.builders import engine, tree as tenants

    with pytest.raises(ModelError, match="not both"):
        engine(tenants("A"), "flex", ("cpu", "mem"), max_fairness_loss=0.1, min_makespan_reduction=0.1)


def test_the_shipped_model_loads_and_covers_both_slas():
    model = load_model(DEFAULT_MODEL)
    assert set(model.trees) == {"max_fairness_loss", "min_makespan_reduction"}
    assert json.loads(DEFAULT_MODEL.read_text())["metadata"]["workloads"] > 0


def complementary_scenario():
    from fairstream.flex_train import workload

    return workload(3, 0.5, "google")  # half CPU-heavy, half memory-heavy tenants: degree 1


def run(policy, **params):
    from fairstream.simulator import Simulator

    return Simulator(complementary_scenario(), policy, {k: str(v) for k, v in params.items()}).run()


def test_with_no_fairness_loss_allowed_every_decision_is_drfs():
    result = run("flex", max_fairness_loss=0)
    assert result.decisions and {d.policy for d in result.decisions} == {"drf"}
    assert all(d.reason.startswith("flex: degree") for d in result.decisions)


def test_a_complementary_workload_with_a_generous_threshold_runs_perf_and_finishes_sooner_than_drf():
    flex, drf = run("flex", max_fairness_loss=1.0), run("drf")
    assert "perf" in {d.policy for d in flex.decisions}
    assert flex.summary()["makespan"] < drf.summary()["makespan"]


@pytest.mark.parametrize("kind, threshold, expected", [
    # E and F against DRF per candidate: perf is fastest but loses fairness, fair is in between.
    pytest.param("max_fairness_loss", 0.0, "drf", id="no loss allowed: DRF"),
    pytest.param("max_fairness_loss", 0.1, "fair", id="a little loss allowed: the fastest within it"),
    pytest.param("max_fairness_loss", 0.5, "perf", id="much loss allowed: the fastest"),
    pytest.param("min_makespan_reduction", 0.05, "fair", id="a small reduction asked: the fairest reaching it"),
    pytest.param("min_makespan_reduction", 0.5, "perf", id="an unreachable reduction: the fastest"),
])
def test_training_labels_pick_the_candidate_that_best_meets_the_sla(kind, threshold, expected):
    from fairstream.flex_train import label

    candidates = {"drf": {"E": 0.0, "F": 0.0, "F_long_term": 0.0}, "fair": {"E": 0.05, "F": 0.08, "F_long_term": 0.3},
                  "fifo": {"E": 0.02, "F": 0.9, "F_long_term": 0.5}, "perf": {"E": 0.2, "F": 0.4, "F_long_term": 0.1}}
    assert label(candidates, kind, threshold) == expected
    # The long-term measure changes the answer where the two losses disagree.
    assert label(candidates, "max_fairness_loss", 0.1, loss="F_long_term") == "perf"
