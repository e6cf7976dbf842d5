"""FLEX (the FLEX paper): complementary degree (formulas 1-4), E and F (formulas 6-8), the model
file, and the meta-scheduler's choices."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fairstream.core.flex import (
    DEFAULT_MODEL,
    FlexModel,
    Tree,
    complementary_degree,
    fairness_loss,
    load_model,
    long_term_fairness_loss,
    makespan_reduction,
)
from fairstream.core.model import ModelError

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


def _model_text(trees=("max_fairness_loss", "min_makespan_reduction"), **arrays) -> str:
    """A model file whose trees are ``test_a_model_file_round_trips``'s, with ``arrays`` replaced."""
    tree = {"children_left": [1, -1, -1], "children_right": [2, -1, -1], "feature": [1, -2, -2],
            "threshold": [0.15, -2.0, -2.0], "leaf_class": [2, 2, 3], **arrays}
    kinds = [trees] if isinstance(trees, str) else trees
    return json.dumps({"format": "fairstream-flex-model", "version": 1, "classes": ["fifo", "fair", "drf", "perf"],
                       "trees": {kind: tree for kind in kinds}})


@pytest.mark.parametrize("content, message", [
    pytest.param(None, "cannot read", id="a missing model file"),
    pytest.param("{not json", "not JSON", id="a file that is not JSON"),
    pytest.param('{"format": "other"}', "not a FLEX model file", id="a JSON file of another kind"),
    pytest.param('{"format": "fairstream-flex-model", "version": 99}', "model version 99", id="a model of another version"),
    pytest.param('{"format": "fairstream-flex-model", "version": 1, "classes": ["drf"], "trees": {"max_fairness_loss": '
                 '{"children_left": [-1], "children_right": [-1], "feature": [0], "threshold": [0], "leaf_class": [5]}}}',
                 "malformed model", id="a tree pointing at a class that is not there"),
    pytest.param(_model_text(children_left=[5, -1, -1]), "children 5, 2 must come after it",
                 id="a child outside the arrays"),
    pytest.param(_model_text(children_left=[0, -1, -1], children_right=[0, -1, -1]), "must come after it",
                 id="a tree whose walk would never end"),
    pytest.param(_model_text(feature=[7, -2, -2]), "feature 7 out of range", id="a feature the model does not have"),
    pytest.param(_model_text(threshold=["x", -2, -2]), "threshold 'x' is not a finite number",
                 id="a threshold that is not a number"),
    pytest.param(_model_text(trees="min_makespan_reduction"), "no tree for the SLA max_fairness_loss",
                 id="no tree for the SLA in use"),
    pytest.param('{"format": "fairstream-flex-model", "version": 1, "classes": ["drf"], "trees": []}',
                 "malformed model", id="trees that are not an object"),
    pytest.param("[" * 100_000, "not JSON", id="JSON nested deeper than the parser goes"),
])
def test_a_bad_model_file_is_one_line_naming_it(tmp_path, content, message):
    from tests.builders import engine
    from tests.builders import tree as tenants

    path = tmp_path / "model.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ModelError, match=message) as error:
        engine(tenants("A"), "flex", ("cpu", "mem"), model=str(path))
    assert "\n" not in str(error.value) and "model" in str(error.value)


node_index = st.integers(-3, 6)


@settings(max_examples=300, deadline=None)
@given(size=st.integers(0, 5), data=st.data())
def test_any_tree_in_a_model_file_is_refused_in_one_line_or_predicts_for_any_input(tmp_path_factory, size, data):
    arrays = {name: data.draw(st.lists(values, min_size=size, max_size=size), label=name) for name, values in (
        ("children_left", node_index), ("children_right", node_index), ("feature", st.integers(-2, 3)),
        ("threshold", st.one_of(st.floats(allow_nan=True), st.integers(), st.text(max_size=2))),
        ("leaf_class", st.integers(-1, 5)))}
    path = tmp_path_factory.mktemp("model") / "model.json"
    path.write_text(_model_text(**arrays))
    try:
        model = load_model(path)
    except ModelError as error:
        assert "\n" not in str(error)
        return
    for degree, threshold in data.draw(st.lists(st.tuples(st.floats(0, 10), st.floats(0, 1)), min_size=1, max_size=5)):
        assert model.choose("max_fairness_loss", degree, threshold) in ("fifo", "fair", "drf", "perf")


def test_a_bad_model_file_on_the_command_line_is_one_line_on_stderr_and_exit_2(tmp_path, capsys):
    from fairstream.cli import main

    path = tmp_path / "model.json"
    path.write_text(_model_text(children_left=[0, -1, -1], children_right=[0, -1, -1]))
    code = main(["simulate", "--scenario", "examples/two-tenants.json", "--policy", "flex", "--param", f"model={path}",
                 "--out", str(tmp_path / "out")])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == ""
    [line] = captured.err.splitlines()
    assert line.startswith(f"fairstream: error: --param model={path}: malformed model (tree max_fairness_loss: node 0")


def test_two_slas_at_once_are_refused():
    from tests.builders import engine
    from tests.builders import tree as tenants

    with pytest.raises(ModelError, match="not both"):
        engine(tenants("A"), "flex", ("cpu", "mem"), max_fairness_loss=0.1, min_makespan_reduction=0.1)


def test_the_shipped_model_loads_and_covers_both_slas():
    model = load_model(DEFAULT_MODEL)
    assert set(model.trees) == {"max_fairness_loss", "min_makespan_reduction"}
    assert json.loads(DEFAULT_MODEL.read_text())["metadata"]["workloads"] > 0


def complementary_scenario():
    from fairstream.lab.flex_train import workload

    return workload(3, 0.5, "google")  # half CPU-heavy, half memory-heavy tenants: degree 1


def run(policy, **params):
    from fairstream.sim.simulator import Simulator

    return Simulator(complementary_scenario(), policy, {k: str(v) for k, v in params.items()}).run()


def test_with_no_fairness_loss_allowed_every_decision_is_drfs():
    result = run("flex", max_fairness_loss=0)
    assert result.decisions and {d.policy for d in result.decisions} == {"drf"}
    assert all(d.reason.startswith("flex: degree") for d in result.decisions)


@pytest.mark.slow
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
    from fairstream.lab.flex_train import label

    candidates = {"drf": {"E": 0.0, "F": 0.0, "F_long_term": 0.0}, "fair": {"E": 0.05, "F": 0.08, "F_long_term": 0.3},
                  "fifo": {"E": 0.02, "F": 0.9, "F_long_term": 0.5}, "perf": {"E": 0.2, "F": 0.4, "F_long_term": 0.1}}
    assert label(candidates, kind, threshold) == expected
    # The long-term measure changes the answer where the two losses disagree.
    assert label(candidates, "max_fairness_loss", 0.1, loss="F_long_term") == "perf"
