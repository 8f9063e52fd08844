"""The classification-cost micro-benchmark: it measures each class, before and after."""

from __future__ import annotations

from bench import classify_cost
from obs.config import default_config_path, load_config
from obs.lanes import Classifier, RequestAttrs, prompt_shape


def test_the_benchmark_bodies_are_recognised_as_their_class_by_the_shipped_lanes() -> None:
    """Each benchmark body lands in its own class's lane (so the cost measured is a real path)."""
    cl = Classifier(load_config(default_config_path()))
    for name, body in classify_cost.bodies(0).items():
        if name == "slow-stream":
            continue  # recognised from behaviour, not from the body
        shape = prompt_shape(body)
        attrs = RequestAttrs(
            route="/v1/chat/completions",
            model=None,
            stream=body.get("stream") is True,
            headers={},
            tenant=None,
            max_tokens=body.get("max_tokens"),
            prompt_tokens=shape.tokens,
            tools=shape.tools,
            context_in=shape.context_in,
        )
        assert cl.decide(attrs)[0].name == name


def test_the_benchmark_reports_every_class_and_the_added_cost() -> None:
    """measure() gives before/after per class and the median and worst added µs."""
    result = classify_cost.measure(n=5, repeats=1)
    assert set(result["per_class"]) == set(classify_cost.bodies(0))
    for v in result["per_class"].values():
        assert v["before_us"] > 0 and v["after_us"] > 0
        assert abs(v["added_us"] - (v["after_us"] - v["before_us"])) < 0.02
    added = [v["added_us"] for v in result["per_class"].values()]
    assert result["added_us_max"] == max(added)
    assert "µs CPU per request" in classify_cost.summary_line(result)
