"""``benchmarks.suffix_offline`` on two vendored problems: the replay's tau, and the prefix-chain check of the
tuner's counterfactual records (``--prefix-chains``), which must not change the replay it rides on."""

from __future__ import annotations

from benchmarks.suffix_offline import DATA, TOKENIZER, load_problems, run_setting


def test_prefix_chains_ride_on_the_replay_and_compare_the_counterfactual_with_the_chains_own_drafts():
    problems = load_problems(DATA, TOKENIZER, 2)
    plain = run_setting(problems, "siblings", 8, {})
    checked = run_setting(problems, "siblings", 8, {}, shadow=[4, 8])
    assert "prefix_chains" not in plain and plain["tau"] > 1.5
    assert checked["tau"] == plain["tau"] and checked["verify_steps"] == plain["verify_steps"]
    assert list(checked["prefix_chains"]) == [4]  # only budgets below the played one
    c = checked["prefix_chains"][4]
    # the counterfactual min(accepted_8, 4) per step is at most 4 and at most the 8-chain's accepted tokens
    assert 0 < c["counterfactual_per_step"] <= min(4.0, checked["tau"] - 1)
    assert 0 < c["accepted_per_step"] <= 4.0 and 0.5 < c["counterfactual_over_own"] < 1.5
    assert 0.5 < c["prefix_share"] <= 1.0
