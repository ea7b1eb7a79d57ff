"""Arm parsing and validation: names, defaults, and clear errors for bad config."""

import pytest

from services.tuner.arms import OFF, Arm, Drafter, TunerConfigError, default_arms, parse_arms


def test_drafter_is_str_enum():
    assert Drafter("suffix") is Drafter.SUFFIX
    assert Drafter.HYBRID == "hybrid"
    assert {d.value for d in Drafter} == {"off", "suffix", "learned", "ngram", "hybrid"}


def test_arm_names_and_round_trip():
    assert OFF.name == "off"
    assert Arm(Drafter.SUFFIX, 8).name == "suffix-k8-w1"
    assert Arm("learned", 16, 2, 4).name == "learned-k16-w2-d4"
    assert Arm("ngram", 3).depth == 3
    assert Arm("learned", 16, 2, 4).depth == 4
    for arm in default_arms():
        assert Arm.from_name(arm.name) == arm
        assert Arm.from_dict(arm.to_dict()) == arm
    assert hash(Arm("suffix", 8)) == hash(Arm(Drafter.SUFFIX, 8))


def test_default_arms_are_sensible():
    arms = default_arms()
    assert arms[0] == OFF
    assert len({a.name for a in arms}) == len(arms)
    assert {a.drafter for a in arms} == set(Drafter)
    depths = sorted(a.depth for a in arms if not a.is_off)
    assert depths[0] >= 2 and depths[-1] <= 32
    assert any(a.tree_width > 1 for a in arms)
    assert parse_arms(arms) == arms


def test_parse_mixed_entries_and_off_added():
    arms = parse_arms(
        [
            {"drafter": "suffix", "max_draft_tokens": 8},
            "learned-k12-w2-d6",
            Arm(Drafter.NGRAM, 3),
            {"drafter": "HYBRID", "max_draft_tokens": 8.0, "tree_width": 1},
        ]
    )
    assert [a.name for a in arms] == [
        "off",
        "suffix-k8-w1",
        "learned-k12-w2-d6",
        "ngram-k3-w1",
        "hybrid-k8-w1",
    ]


def test_parse_keeps_configured_off_position():
    arms = parse_arms(["suffix-k4-w1", {"drafter": "off"}])
    assert [a.name for a in arms] == ["suffix-k4-w1", "off"]


def test_parse_accepts_omegaconf():
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"arms": [{"drafter": "suffix", "max_draft_tokens": 8}, "off"]})
    assert [a.name for a in parse_arms(cfg.arms)] == ["suffix-k8-w1", "off"]


@pytest.mark.parametrize(
    "entries, fragments",
    [
        ([{"drafter": "eagle", "max_draft_tokens": 4}], ["arms[0]", "unknown drafter 'eagle'", "suffix"]),
        (["off", "medusa-k4-w1"], ["arms[1]", "unknown drafter 'medusa'"]),
        ([], ["empty"]),
        (None, ["missing"]),
        ([{"drafter": "suffix", "max_draft_tokens": 0}], ["arms[0]", "max_draft_tokens must be > 0"]),
        ([{"drafter": "suffix", "max_draft_tokens": -4}], ["arms[0]", "max_draft_tokens must be > 0"]),
        ([{"drafter": "suffix"}], ["arms[0]", "max_draft_tokens must be > 0"]),
        ([{"drafter": "learned", "max_draft_tokens": 4, "tree_width": 0}], ["tree_width must be >= 1"]),
        ([{"drafter": "learned", "max_draft_tokens": 4, "tree_depth": -1}], ["tree_depth must be >= 0"]),
        (
            [{"drafter": "learned", "max_draft_tokens": 4, "tree_depth": 8}],
            ["cannot exceed max_draft_tokens"],
        ),
        ([{"drafter": "learned", "max_draft_tokens": 8, "tree_width": 2}], ["needs tree_depth > 0"]),
        ([{"drafter": "suffix", "max_tokens": 4}], ["arms[0]", "unknown key", "max_tokens"]),
        ([{"max_draft_tokens": 4}], ["arms[0]", "missing required key 'drafter'"]),
        ([{"drafter": "suffix", "max_draft_tokens": "8"}], ["max_draft_tokens must be an integer"]),
        ([{"drafter": "suffix", "max_draft_tokens": True}], ["max_draft_tokens must be an integer"]),
        ([{"drafter": "off", "max_draft_tokens": 4}], ["'off' takes no draft"]),
        (["suffix-k8-w1", {"drafter": "suffix", "max_draft_tokens": 8}], ["arms[1]", "duplicate", "arms[0]"]),
        (["suffix-8"], ["cannot parse arm name"]),
        ([42], ["arms[0]", "expected a mapping or an arm name"]),
        ("suffix-k8-w1", ["expected a list"]),
    ],
)
def test_parse_errors_are_clear(entries, fragments):
    with pytest.raises(TunerConfigError) as ei:
        parse_arms(entries, source="configs/x.yaml")
    msg = str(ei.value)
    assert msg.startswith("configs/x.yaml: tuner.arms")
    for f in fragments:
        assert f in msg, msg


def test_tuner_config_error_is_value_error():
    assert issubclass(TunerConfigError, ValueError)
    with pytest.raises(ValueError):
        Arm("suffix", 0)
